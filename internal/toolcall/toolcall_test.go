package toolcall

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

type result struct {
	content string
	calls   []Call // IDs cleared
}

// run feeds text in pieces of at most chunk bytes (0: at once) and
// reassembles the deltas as a streaming client would.
func run(t testing.TB, format, text string, chunk int, rng *rand.Rand) result {
	p, err := New(format)
	if err != nil {
		t.Fatal(err)
	}
	var r result
	apply := func(d Delta) {
		r.content += d.Content
		for _, c := range d.Calls {
			switch {
			case c.Index == len(r.calls):
				if c.Name == "" || c.ID == "" {
					t.Fatalf("call %d begins without a name or id: %+v", c.Index, c)
				}
				r.calls = append(r.calls, Call{Name: c.Name, Arguments: c.Arguments})
			case c.Index < len(r.calls):
				if c.Name != "" {
					t.Fatalf("call %d named twice", c.Index)
				}
				r.calls[c.Index].Arguments += c.Arguments
			default:
				t.Fatalf("call index %d skips ahead of %d", c.Index, len(r.calls))
			}
		}
	}
	for len(text) > 0 {
		n := len(text)
		if chunk > 0 {
			n = min(n, 1+rng.IntN(chunk))
		}
		apply(p.Push(text[:n]))
		text = text[n:]
	}
	apply(p.Finish())
	calls := p.Calls()
	if len(calls) != len(r.calls) {
		t.Fatalf("Calls() has %d calls, deltas %d", len(calls), len(r.calls))
	}
	for i := range calls {
		if calls[i].Name != r.calls[i].Name || calls[i].Arguments != r.calls[i].Arguments {
			t.Fatalf("Calls()[%d] = %+v, deltas %+v", i, calls[i], r.calls[i])
		}
	}
	return r
}

func TestFormats(t *testing.T) {
	for _, tc := range []struct {
		format, text, content string
		calls                 []Call
	}{
		{"hermes", "plain answer", "plain answer", nil},
		{"hermes", "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
			"Let me check.", []Call{{Name: "get_weather", Arguments: `{"city": "Paris"}`}}},
		{"qwen25", "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"x\": [1, {\"y\": \"}\"}]}, \"name\": \"b\"}\n</tool_call>",
			"", []Call{{Name: "a", Arguments: `{}`}, {Name: "b", Arguments: `{"x": [1, {"y": "}"}]}`}}},
		{"hermes", "<tool_call>\n{\"name\": \"s\", \"arguments\": \"{\\\"q\\\": 1}\"}\n</tool_call>", "", []Call{{Name: "s", Arguments: `{"q": 1}`}}},
		{"hermes", "<tool_call>not json</tool_call> after", "<tool_call>not json</tool_call> after", nil},
		{"hermes", "a < b and <tool", "a < b and <tool", nil},
		{"llama3", `{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}`, "",
			[]Call{{Name: "f", Arguments: `{"a": 1}`}, {Name: "g", Arguments: `{}`}}},
		{"llama3", `<|python_tag|>{"name": "f", "arguments": {"a": "b"}}`, "", []Call{{Name: "f", Arguments: `{"a": "b"}`}}},
		{"llama3", `{"answer": 42}`, `{"answer": 42}`, nil},
		{"llama3", `Sure: {"name": "f"}`, `Sure: {"name": "f"}`, nil},
		{"mistral", `[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": [2]}}]`, "",
			[]Call{{Name: "f", Arguments: `{"a": 1}`}, {Name: "g", Arguments: `{"b": [2]}`}}},
		{"mistral", "No tools [needed].", "No tools [needed].", nil},
		{"mistral", ` [{"name": "f", "arguments": {"a": 1}}]`, "", []Call{{Name: "f", Arguments: `{"a": 1}`}}},
		{"mistral", `[{"x": 1}] and [ ]`, `[{"x": 1}] and [ ]`, nil},
		{"pythonic", `[get_weather(city="Paris", days=3), now()]`, "",
			[]Call{{Name: "get_weather", Arguments: `{"city": "Paris", "days": 3}`}, {Name: "now", Arguments: `{}`}}},
		{"pythonic", `[f(a=True, b=None, c='it\'s', d=[1, 2.5], e={'k': (1,)})]`, "",
			[]Call{{Name: "f", Arguments: `{"a": true, "b": null, "c": "it's", "d": [1, 2.5], "e": {"k": [1]}}`}}},
		{"pythonic", `<|python_start|>[f(x=1)]<|python_end|>`, "", []Call{{Name: "f", Arguments: `{"x": 1}`}}},
		{"pythonic", `[1, 2, 3]`, `[1, 2, 3]`, nil},
		{"pythonic", `Hello [world]`, `Hello [world]`, nil},
	} {
		rng := rand.New(rand.NewPCG(1, 2))
		for _, chunk := range []int{0, 1, 3, 7} {
			got := run(t, tc.format, tc.text, chunk, rng)
			if got.content != tc.content || !reflect.DeepEqual(got.calls, tc.calls) {
				t.Errorf("%s %q (chunks of %d): got content %q calls %+v; want %q %+v", tc.format, tc.text, chunk, got.content, got.calls, tc.content, tc.calls)
			}
			for _, c := range got.calls {
				if !json.Valid([]byte(c.Arguments)) {
					t.Errorf("%s: arguments %q are not JSON", tc.format, c.Arguments)
				}
			}
		}
	}
}

// TestStreamsArguments checks that a JSON format sends the arguments in
// pieces as they come, not all at the end.
func TestStreamsArguments(t *testing.T) {
	p, _ := New("hermes")
	var pieces int
	text := "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"text\": \"a long argument\"}}\n</tool_call>"
	for i := range text {
		d := p.Push(text[i : i+1])
		for _, c := range d.Calls {
			if c.Arguments != "" {
				pieces++
			}
		}
	}
	p.Finish()
	if pieces < 10 {
		t.Fatalf("arguments came in %d pieces; want them streamed", pieces)
	}
}

func TestUnknownFormat(t *testing.T) {
	if _, err := New("xml"); err == nil || Valid("xml") || !Valid("hermes") {
		t.Fatal("an unknown parser name was accepted")
	}
}

// FuzzStreamEqualsWhole checks, for every format, that any text gives the
// same content and calls however it is cut, and never panics.
func FuzzStreamEqualsWhole(f *testing.F) {
	for _, s := range []string{
		"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
		`{"name": "f", "parameters": {"a": 1}}; {"name": "g"}`,
		`[TOOL_CALLS] [{"name": "f", "arguments": {}}]`,
		`[f(a=1, b='x'), g()]`, "text <tool_call>{\"name\": 1}", `[f(a=[1, {"k": "v"}])] tail`,
	} {
		f.Add(s, uint64(1))
	}
	f.Fuzz(func(t *testing.T, text string, seed uint64) {
		for _, format := range Formats {
			whole := run(t, format, text, 0, nil)
			part := run(t, format, text, 5, rand.New(rand.NewPCG(seed, 3)))
			if whole.content != part.content || !reflect.DeepEqual(whole.calls, part.calls) {
				t.Fatalf("%s %q: whole %+v, in parts %+v", format, text, whole, part)
			}
			if len(whole.calls) == 0 && noSpace(whole.content) != noSpace(text) && !strings.Contains(text, "<|python") && !strings.Contains(text, "[TOOL_CALLS]") {
				t.Fatalf("%s %q: no calls but content %q", format, text, whole.content)
			}
		}
	})
}

func noSpace(s string) string {
	return strings.Map(func(r rune) rune {
		if strings.ContainsRune(spaces, r) {
			return -1
		}
		return r
	}, s)
}
