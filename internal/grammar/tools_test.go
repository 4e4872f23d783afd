package grammar

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/batonlm/baton/internal/toolcall"
)

const (
	weatherParams = `{"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}`
	searchParams  = `{"type": "object", "properties": {"query": {"$ref": "#/$defs/q"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3}}, "required": ["query"], "$defs": {"q": {"type": "string", "maxLength": 10}}}`
)

// TestToolCallSamples draws random outputs under each format's grammar
// (Qwen3's vocabulary) and reads them back with the matching parser: every
// complete output is only calls, of the functions allowed, whose
// arguments validate against their schemas.
func TestToolCallSamples(t *testing.T) {
	tok := loadTok(t, "qwen3")
	vals := map[string]*jsonschema.Schema{
		"get_weather": compileValidator(t, weatherParams),
		"search":      compileValidator(t, searchParams),
	}
	for _, format := range ToolCallFormats {
		for _, parallel := range []bool{false, true} {
			spec, _ := json.Marshal(ToolCallSpec{Format: format, Parallel: parallel, Tools: []ToolSpec{
				{Name: "get_weather", Parameters: json.RawMessage(weatherParams)},
				{Name: "search", Parameters: json.RawMessage(searchParams)},
			}})
			g, err := FromToolCalls(string(spec))
			if err != nil {
				t.Fatalf("%s: %v", format, err)
			}
			c := mustCompile(t, g, tok)
			rng := rand.New(rand.NewPCG(uint64(len(format)), 3))
			done := 0
			for try := 0; try < 40 && done < 6; try++ {
				ids, ok := sample(t, c, rng, 400)
				if !ok {
					continue
				}
				done++
				text := tok.Decode(ids)
				p, err := toolcall.New(format)
				if err != nil {
					t.Fatal(err)
				}
				d := p.Push(text)
				d2 := p.Finish()
				calls := p.Calls()
				if strings.TrimSpace(d.Content+d2.Content) != "" || len(calls) == 0 || (!parallel && len(calls) > 1) {
					t.Fatalf("%s (parallel %v): %q read as content %q and %d calls", format, parallel, text, d.Content+d2.Content, len(calls))
				}
				for _, call := range calls {
					val := vals[call.Name]
					if val == nil {
						t.Fatalf("%s: %q calls unknown %q", format, text, call.Name)
					}
					v, err := jsonschema.UnmarshalJSON(strings.NewReader(call.Arguments))
					if err != nil {
						t.Fatalf("%s: %q: arguments %q: %v", format, text, call.Arguments, err)
					}
					if err := val.Validate(v); err != nil {
						t.Fatalf("%s: %q: arguments %q: %v", format, text, call.Arguments, err)
					}
				}
			}
			if done == 0 {
				t.Fatalf("%s: no sample completed", format)
			}
		}
	}
}

func TestToolCallSpecErrors(t *testing.T) {
	for _, spec := range []string{
		`{"format": "hermes", "tools": []}`,
		`{"format": "xml", "tools": [{"name": "f"}]}`,
		`{"format": "hermes", "tools": [{"name": ""}]}`,
		`{"format": "pythonic", "tools": [{"name": "not an identifier"}]}`,
		`{"format": "hermes", "tools": [{"name": "f", "parameters": {"not": {}}}]}`,
		`not json`,
	} {
		if _, err := FromToolCalls(spec); err == nil {
			t.Errorf("%s: accepted", spec)
		}
	}
}
