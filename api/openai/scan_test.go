package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fuzzBound is the prompt bound of the decoder fuzz targets: small, so
// that mutated bodies cross it.
const fuzzBound = 8

func seedDecoder(f *testing.F) {
	seedBodies(f)
	for _, s := range []string{
		`{"prompt":[1,2,3]}`, `{"prompt":[[1,2,3]]}`, `{"prompt":["a"]}`, `{"prompt":"x","prompt":[4]}`,
		`{"prompt":[1,2,3,4,5,6,7,8,9]}`, `{"prompt":[[1,2,3,4,5,6,7,8,9]]}`, `{"prompt":[1.0,1e3,-0,0]}`,
		`{"prompt":[]}`, `{"prompt":[[]]}`, `{"prompt":[[1],[2]]}`, `{"prompt":[1,"a"]}`, `{"prompt":[-1]}`,
		`{"prompt":[2147483648]}`, `{"prompt":[2147483647]}`, `{"prompt":[01]}`, `{"prompt":[1,]}`,
		`{"prompt":{"a":1}}`, `{"prompt":null}`, `{"prompt":[true]}`, `{"pr\u006fmpt":[1]}`,
		` { "prompt" : [ 1 , 2 ] } `, `{}`, `[]`, `null`, `"x"`, `{"a":1}x`, `{"a":}`, `{"a" 1}`,
		`{"a":[1,2}`, `{"a":"\"}`, `{"a":"\u00e9\ud83d\ude00"}`, "{\"a\":\"\x01\"}", `{"a":1,}`,
		`{"\xff":1}`, `{"a":[[[[[]]]]]}`, `{"prompt":[1e400]}`, `{"prompt":[1.5]}`,
	} {
		f.Add([]byte(s))
	}
}

// numbersIn counts the JSON numbers of a decoded value.
func numbersIn(v any) int {
	switch x := v.(type) {
	case json.Number:
		return 1
	case []any:
		n := 0
		for _, e := range x {
			n += numbersIn(e)
		}
		return n
	case map[string]any:
		n := 0
		for _, e := range x {
			n += numbersIn(e)
		}
		return n
	}
	return 0
}

// The decoder agrees with encoding/json on every body within its bounds:
// the same members with the same bytes, and an error exactly where
// encoding/json has one. A body over the bounds is refused.
func FuzzDecodeObject(f *testing.F) {
	seedDecoder(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		got, e := decodeObject(body, Limits{MaxPromptTokens: fuzzBound})
		var want map[string]json.RawMessage
		err := json.Unmarshal(bytes.TrimSpace(body), &want)
		if err != nil || want == nil {
			if e == nil {
				t.Fatalf("decoded %q, which encoding/json refuses (%v)", body, err)
			}
			return
		}
		// The bounds: members, and the numbers of every prompt member (a
		// repeated one is checked each time it comes).
		members, overBound := 0, false
		d := json.NewDecoder(bytes.NewReader(bytes.TrimSpace(body)))
		d.UseNumber()
		_, _ = d.Token()
		for d.More() {
			k, _ := d.Token()
			var v any
			_ = d.Decode(&v)
			members++
			if k == "prompt" && numbersIn(v) > fuzzBound {
				overBound = true
			}
		}
		overBound = overBound || members > maxFields
		if e != nil {
			if !overBound {
				t.Fatalf("refused %q (%v), which encoding/json decodes", body, e)
			}
			return
		}
		if members > maxFields {
			t.Fatalf("accepted %d members from %q", members, body)
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d members, encoding/json %d", body, len(got), len(want))
		}
		for k, v := range want {
			if !bytes.Equal(got[k], v) {
				t.Fatalf("%q: member %q is %q, encoding/json %q", body, k, got[k], v)
			}
		}
	})
}

// refPrompt is the prompt decoding this package had before it decoded
// within a bound: encoding/json's, one allocation per element.
func refPrompt(f map[string]json.RawMessage) ([]Prompt, *Error) {
	raw, ok := fields(f).get("prompt")
	if !ok {
		return nil, BadRequest("you must provide a prompt parameter", "prompt")
	}
	const kinds = "prompt must be a string, an array of token ids, or an array of strings or of arrays of token ids"
	if s, ok := parseString(raw); ok {
		if s == "" {
			return nil, BadRequest("prompt must not be empty", "prompt")
		}
		return []Prompt{{Text: s}}, nil
	}
	ids := func(raw json.RawMessage) ([]int32, int) {
		var list []json.RawMessage
		if raw[0] != '[' || json.Unmarshal(raw, &list) != nil {
			return nil, -1
		}
		out := make([]int32, 0, len(list))
		for i, el := range list {
			n, ok := parseInt(el)
			if !ok || n < 0 || n > math.MaxInt32 {
				return nil, i
			}
			out = append(out, int32(n))
		}
		return out, -1
	}
	var list []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &list) != nil {
		return nil, BadRequest(kinds, "prompt")
	}
	if len(list) == 0 {
		return nil, BadRequest("prompt must not be empty", "prompt")
	}
	first := bytes.TrimSpace(list[0])
	if first[0] == '"' || first[0] == '[' {
		var out []Prompt
		for i, el := range list {
			at := fmt.Sprintf("prompt[%d]", i)
			if i == MaxPrompts {
				return nil, BadRequest(fmt.Sprintf("prompt may list at most %d prompts", MaxPrompts), "prompt")
			}
			el = bytes.TrimSpace(el)
			if s, ok := parseString(el); ok {
				if s == "" {
					return nil, BadRequest("prompt must not be empty", at)
				}
				out = append(out, Prompt{Text: s})
				continue
			}
			got, bad := ids(el)
			switch {
			case bad >= 0:
				return nil, BadRequest("prompt token ids must be non-negative integers", fmt.Sprintf("%s[%d]", at, bad))
			case got == nil:
				return nil, BadRequest(kinds, at)
			case len(got) == 0:
				return nil, BadRequest("prompt must not be empty", at)
			}
			out = append(out, Prompt{TokenIDs: got})
		}
		return out, nil
	}
	got, bad := ids(raw)
	if bad >= 0 {
		return nil, BadRequest("prompt token ids must be non-negative integers", fmt.Sprintf("prompt[%d]", bad))
	}
	return []Prompt{{TokenIDs: got}}, nil
}

// Within the bound, the prompt reads as encoding/json read it: the same
// texts or ids, or a 400 naming the same param.
func FuzzPrompt(f *testing.F) {
	seedDecoder(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		var m map[string]json.RawMessage
		if json.Unmarshal(bytes.TrimSpace(body), &m) != nil || m == nil || len(m) > maxFields {
			return
		}
		want, wantE := refPrompt(m)
		f, e := decodeObject(body, Limits{MaxPromptTokens: fuzzBound})
		if e != nil {
			if e.Code == nil || *e.Code != CodeContextLength {
				t.Fatalf("%q: %v, which encoding/json decodes", body, e)
			}
			return
		}
		got, e := f.prompts(fuzzBound)
		for _, p := range want {
			if len(p.TokenIDs) > fuzzBound {
				if e == nil || e.Code == nil || *e.Code != CodeContextLength {
					t.Fatalf("%q: %d ids over a bound of %d gave %v", body, len(p.TokenIDs), fuzzBound, e)
				}
				return
			}
		}
		switch {
		case (e == nil) != (wantE == nil):
			t.Fatalf("%q: got (%v, %v), encoding/json (%v, %v)", body, got, e, want, wantE)
		case e != nil && (e.Message != wantE.Message || *e.Param != *wantE.Param) && (e.Code == nil || *e.Code != CodeContextLength):
			t.Fatalf("%q: error %v, encoding/json %v", body, e, wantE)
		case e == nil && !slices.EqualFunc(got, want, func(a, b Prompt) bool {
			return a.Text == b.Text && slices.Equal(a.TokenIDs, b.TokenIDs) && (a.TokenIDs == nil) == (b.TokenIDs == nil)
		}):
			t.Fatalf("%q: got %v, encoding/json %v", body, got, want)
		}
	})
}

// A prompt of millions of ids is refused at the bound with nothing
// allocated for it: the body is not copied, the ids past the bound never
// decoded.
func TestHugePromptDecodedWithinItsBound(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"model":"m","prompt":[`)
	for i := 0; b.Len() < 30<<20; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(1000 + i%30000))
	}
	b.WriteString(`]}`)
	body := []byte(b.String())
	for _, nested := range []bool{false, true} {
		if nested {
			body = []byte(strings.Replace(strings.Replace(b.String(), `"prompt":[`, `"prompt":[[`, 1), `]}`, `]]}`, 1))
		}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		_, e := ParseCompletionRequestLimited(body, Limits{MaxPromptTokens: 131071})
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		if e == nil || e.Code == nil || *e.Code != CodeContextLength || *e.Param != "prompt" {
			t.Fatalf("nested %v: %v, want a context_length_exceeded 400 on prompt", nested, e)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
			t.Errorf("nested %v: %d KiB allocated to refuse a %d MiB prompt", nested, alloc>>10, len(body)>>20)
		}
		t.Logf("nested %v: refused in %v", nested, took)
	}
	// Within the bound the same ids are decoded, into their own slice only.
	ids := make([]string, 131071)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	r, e := ParseCompletionRequestLimited([]byte(`{"model":"m","prompt":[`+strings.Join(ids, ",")+`]}`), Limits{MaxPromptTokens: 131071})
	if e != nil || len(r.PromptTokenIDs) != len(ids) || r.PromptTokenIDs[131070] != 131070 {
		t.Fatalf("a prompt at the bound: %v", e)
	}
}
