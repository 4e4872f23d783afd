package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Constraint is what a request asks its output to match: a kind for
// ForRequest and its spec.
type Constraint struct {
	Kind string
	Spec string
}

// ParseResponseFormat reads an OpenAI response_format object:
//
//	{"type": "text"}                                  no constraint (ok false)
//	{"type": "json_object"}                           any JSON object
//	{"type": "json_schema", "json_schema": {"name": "...", "schema": {...}, "strict": true}}
//
// The schema is passed on byte for byte, so its property order, which the
// generated text follows, survives. strict is not needed: the schema is
// always enforced.
func ParseResponseFormat(raw []byte) (c Constraint, ok bool, err error) {
	var rf struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &rf); err != nil {
		return Constraint{}, false, fmt.Errorf("grammar: response_format: %w", err)
	}
	switch rf.Type {
	case "text":
		return Constraint{}, false, nil
	case KindJSONObject:
		return Constraint{Kind: KindJSONObject}, true, nil
	case KindJSONSchema:
		if rf.JSONSchema == nil || len(bytes.TrimSpace(rf.JSONSchema.Schema)) == 0 || bytes.Equal(bytes.TrimSpace(rf.JSONSchema.Schema), []byte("null")) {
			return Constraint{}, false, fmt.Errorf("grammar: response_format json_schema needs json_schema.schema")
		}
		return Constraint{Kind: KindJSONSchema, Spec: string(rf.JSONSchema.Schema)}, true, nil
	}
	return Constraint{}, false, fmt.Errorf("grammar: response_format type %q is not supported", rf.Type)
}
