package grammar

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

var testSchemas = map[string]string{
	"flat":             `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},"score":{"type":"number"},"ok":{"type":"boolean"},"none":{"type":"null"}},"required":["name","age","score","ok","none"]}`,
	"optional":         `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"]}`,
	"all-optional":     `{"type":"object","properties":{"x":{"type":"integer","exclusiveMinimum":-10},"y":{"type":"integer","maximum":-3}}}`,
	"nested":           `{"type":"object","properties":{"user":{"type":"object","properties":{"id":{"type":"integer"},"address":{"type":"object","properties":{"city":{"type":"string","maxLength":12},"zip":{"type":"string","minLength":5,"maxLength":5}},"required":["city","zip"]}},"required":["id","address"]}},"required":["user"]}`,
	"array":            `{"type":"array","items":{"type":"string","maxLength":8},"minItems":2,"maxItems":4}`,
	"array-of-objects": `{"type":"object","properties":{"points":{"type":"array","items":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"]},"maxItems":3}},"required":["points"]}`,
	"enum":             `{"type":"object","properties":{"color":{"enum":["red","green","blue"]},"size":{"enum":[1,2.5,"XL",null,true]},"fixed":{"const":{"k":[1,"two"]}}},"required":["color","size","fixed"]}`,
	"ref":              `{"$defs":{"pos":{"type":"object","properties":{"line":{"type":"integer"},"col":{"type":"integer"}},"required":["line","col"]}},"type":"object","properties":{"start":{"$ref":"#/$defs/pos"},"end":{"$ref":"#/$defs/pos"}},"required":["start","end"]}`,
	"recursive":        `{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},"$ref":"#/$defs/node"}`,
	"anyOf":            `{"type":"object","properties":{"id":{"anyOf":[{"type":"integer"},{"type":"string","maxLength":6}]},"v":{"oneOf":[{"type":"null"},{"type":"array","items":{"type":"boolean"}}]}},"required":["id","v"]}`,
	"type-list":        `{"type":"object","properties":{"maybe":{"type":["string","null"]}},"required":["maybe"]}`,
	"additional":       `{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":{"type":"boolean"}}`,
	"free-object":      `{"type":"object"}`,
	"unicode-key":      `{"type":"object","properties":{"naïve \"q\"":{"type":"string","maxLength":3},"ключ":{"enum":["значение","ü"]}},"required":["naïve \"q\"","ключ"]}`,
	"realistic":        realisticSchema,
	"pattern":          `{"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"},"note":{"type":"string","pattern":"^q[\\\\\"\\n/]{1,3}z$"},"when":{"type":"string","format":"date-time"},"id":{"type":"string","format":"uuid"},"mail":{"type":"string","format":"email"}},"required":["code","note","when","id","mail"]}`,
}

// realisticSchema is the shape of a typical extraction request, also used
// by BenchmarkMask.
const realisticSchema = `{
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "email": {"type": "string"},
    "role": {"enum": ["admin", "editor", "viewer"]},
    "active": {"type": "boolean"},
    "score": {"type": "number"},
    "address": {"type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "integer"}},
      "required": ["street", "city"]},
    "tags": {"type": "array", "items": {"type": "string"}}
  },
  "required": ["name", "age", "email", "role", "active", "address", "tags"]
}`

var testVocabs = []string{"stories260K", "llama-spm", "gpt-2"}

func compileValidator(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestJSONSchemaSamples draws random token sequences under the mask: every
// complete one must be JSON valid under the schema, and decode to exactly
// the bytes the matcher saw.
func TestJSONSchemaSamples(t *testing.T) {
	n := 12
	if testing.Short() {
		n = 3
	}
	for name, schema := range testSchemas {
		t.Run(name, func(t *testing.T) {
			g, err := FromJSONSchema(schema)
			if err != nil {
				t.Fatal(err)
			}
			val := compileValidator(t, schema)
			for _, vn := range testVocabs {
				tok := loadTok(t, vn)
				c := mustCompile(t, g, tok)
				rng := rand.New(rand.NewPCG(uint64(len(name)), 7))
				done := 0
				for range n {
					ids, ok := sample(t, c, rng, 4000)
					if !ok {
						continue
					}
					done++
					text := c.v.text(ids)
					if dec := tok.Decode(ids); dec != text {
						t.Errorf("%s: Decode %q differs from the matched bytes %q", vn, dec, text)
					}
					inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
					if err != nil {
						t.Errorf("%s: not JSON: %q: %v", vn, text, err)
						continue
					}
					if err := val.Validate(inst); err != nil {
						t.Errorf("%s: %q does not validate: %v", vn, text, err)
					}
					checkWhitespace(t, text)
				}
				if done < n/2 {
					t.Errorf("%s: only %d of %d samples finished", vn, done, n)
				}
			}
		})
	}
}

// checkWhitespace holds the generated text to the policy: whitespace
// outside strings is at most one space after ':' or ','.
func checkWhitespace(t *testing.T, s string) {
	t.Helper()
	inString, esc := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inString:
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\n' || c == '\t' || c == '\r':
			if c != ' ' || i == 0 || (s[i-1] != ':' && s[i-1] != ',') {
				t.Errorf("whitespace at %d of %q", i, s)
				return
			}
		}
	}
}

func TestJSONObjectSamples(t *testing.T) {
	g := JSONObject()
	for _, vn := range testVocabs {
		c := mustCompile(t, g, loadTok(t, vn))
		rng := rand.New(rand.NewPCG(3, 4))
		done := 0
		for range 10 {
			ids, ok := sample(t, c, rng, 3000)
			if !ok {
				continue
			}
			done++
			text := c.v.text(ids)
			var v map[string]any
			if err := json.Unmarshal([]byte(text), &v); err != nil {
				t.Errorf("%s: %q is not a JSON object: %v", vn, text, err)
			}
			checkWhitespace(t, text)
		}
		if done == 0 {
			t.Errorf("%s: no sample finished", vn)
		}
	}
}

func TestJSONSchemaErrors(t *testing.T) {
	for _, s := range []string{
		``, `[`, `3`, `false`, `{"type":"strnig"}`, `{"type":"string","pattern":"a+","maxLength":3}`, `{"type":"string","pattern":"a\\bc"}`,
		`{"$ref":"#/$defs/missing"}`, `{"$ref":"http://example.com/s.json"}`,
		`{"allOf":[{"type":"string"},{"maxLength":3}]}`, `{"enum":[]}`,
		`{"type":"array","minItems":3,"maxItems":2}`, `{"type":"string","minLength":-1}`,
		`{"anyOf":[{"$ref":"#"}]}`, // left recursion through the root
		`{"type":"object","properties":{"a":{}},"required":["b"]}`,
	} {
		if _, err := FromJSONSchema(s); err == nil {
			t.Errorf("FromJSONSchema(%s) succeeded", s)
		}
	}
}

// TestSchemaPropertyOrder checks the forced parts of the text: properties
// come in schema order, and an enum or const is spelled compactly.
func TestSchemaPropertyOrder(t *testing.T) {
	g, err := FromJSONSchema(`{"type":"object","properties":{"z":{"const":[1, {"b" : null}]},"a":{"enum":["<&>"]}},"required":["z","a"]}`)
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, g, loadTok(t, "stories260K"))
	for _, s := range []string{`{"z":[1,{"b":null}],"a":"<&>"}`, `{"z": [1,{"b":null}], "a": "<&>"}`} {
		if err := acceptText(c, s, true); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	for _, s := range []string{`{"a":"<&>","z":[1,{"b":null}]}`, `{"z":[1, {"b":null}],"a":"<&>"}`, `{"z":[1,{"b":null}],"a":"<&>", }`, `{ "z":[1,{"b":null}],"a":"<&>"}`, `{"z":[1,{"b":null}],"a":"<&>"} `} {
		if err := acceptText(c, s, true); err == nil {
			t.Errorf("%s accepted", s)
		}
	}
}

func TestSchemaPattern(t *testing.T) {
	g, err := FromJSONSchema(`{"type":"string","pattern":"a[\\\\\"]b"}`)
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, g, loadTok(t, "stories260K"))
	for s, want := range map[string]bool{
		`"a\\b"`: true, `"xa\"by"`: true, `"a\\bb\n"`: true, `"a\\"`: false, `"ab"`: false, `"a"b"`: false, `"a\u0022b"`: false,
	} {
		if got := acceptText(c, s, true) == nil; got != want {
			t.Errorf("%s: got %v, want %v", s, got, want)
		}
	}
}

// acceptText feeds s one byte-sized token at a time (the bundled
// vocabulary has all 256 bytes) and, when end is set, requires that the
// grammar can end there.
func acceptText(c *Compiled, s string, end bool) error {
	m := c.NewMatcher()
	byByte := map[byte]int32{}
	for id, b := range c.v.bytes {
		if len(b) == 1 {
			if _, ok := byByte[b[0]]; !ok {
				byByte[b[0]] = int32(id)
			}
		}
	}
	for i := 0; i < len(s); i++ {
		id, ok := byByte[s[i]]
		if !ok {
			return fmt.Errorf("no token for byte %q", s[i])
		}
		if err := m.Accept(id); err != nil {
			return fmt.Errorf("at %d: %w", i, err)
		}
	}
	if end && !m.CanEnd() {
		return fmt.Errorf("cannot end")
	}
	return nil
}
