package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// miniHFByteLevel is a small Llama 3 style tokenizer.json: every byte,
// a few merges, a split regex, a TemplateProcessing post-processor that
// adds <|begin_of_text|>, and added tokens of both kinds.
func miniHFByteLevel() map[string]any {
	vocab := map[string]int{}
	for c := range 256 {
		vocab[byteEncode[c]] = c
	}
	merges := [][2]string{{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"Ġw", "o"}, {"Ġwo", "r"}, {"Ġwor", "l"}, {"Ġworl", "d"}}
	for _, m := range merges {
		vocab[m[0]+m[1]] = len(vocab)
	}
	n := len(vocab)
	return map[string]any{
		"version": "1.0",
		"added_tokens": []map[string]any{
			{"id": n, "content": "<|begin_of_text|>", "special": true},
			{"id": n + 1, "content": "<|eot_id|>", "special": true},
			{"id": n + 3, "content": "<tool>", "special": false}, // leaves a gap at n+2
		},
		"normalizer": nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "Sequence", "processors": []any{
			map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
			map[string]any{"type": "TemplateProcessing",
				"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
				"special_tokens": map[string]any{"<|begin_of_text|>": map[string]any{"id": "<|begin_of_text|>", "ids": []int{n}, "tokens": []string{"<|begin_of_text|>"}}}},
		}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": true, "byte_fallback": false},
	}
}

// miniHFMetaspace is a small SentencePiece-style tokenizer.json using the
// Metaspace pre-tokenizer (as newer Llama/Mistral files do) with byte
// fallback and "a b" string merges.
func miniHFMetaspace(scheme string, split bool) map[string]any {
	vocab := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	for c := range 256 {
		vocab[fmt.Sprintf("<0x%02X>", c)] = len(vocab)
	}
	for _, s := range []string{"▁", "a", "b", "c", "▁a", "▁b", "ab", "▁ab", "▁▁"} {
		vocab[s] = len(vocab)
	}
	return map[string]any{
		"added_tokens": []map[string]any{
			{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true}, {"id": 2, "content": "</s>", "special": true},
		},
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"▁ a", "▁ b", "a b", "▁a b", "▁ ▁"},
			"unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true},
	}
}

func hfFrom(t *testing.T, tj map[string]any, cfg map[string]any) (*Tokenizer, error) {
	t.Helper()
	b, err := json.Marshal(tj)
	if err != nil {
		t.Fatal(err)
	}
	files := hfFiles{Tokenizer: b}
	if cfg != nil {
		if files.Config, err = json.Marshal(cfg); err != nil {
			t.Fatal(err)
		}
	}
	return fromHF(files)
}

func TestHFSyntheticByteLevel(t *testing.T) {
	tok, err := hfFrom(t, miniHFByteLevel(), map[string]any{"bos_token": "<|begin_of_text|>", "eos_token": map[string]any{"content": "<|eot_id|>"},
		"chat_template": []any{map[string]any{"name": "tool_use", "template": "x"}, map[string]any{"name": "default", "template": "{{ messages }}"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := func(s string) int32 {
		v, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return v
	}
	bos, eot, tool := id("<|begin_of_text|>"), id("<|eot_id|>"), id("<tool>")
	// TemplateProcessing adds BOS; there is no add_bos_token to say otherwise.
	if !tok.AddBOS() || tok.BOS() != bos || tok.EOS() != eot || !tok.IsEOG(eot) || tok.ChatTemplate() != "{{ messages }}" {
		t.Fatalf("AddBOS %v BOS %d EOS %d template %q", tok.AddBOS(), tok.BOS(), tok.EOS(), tok.ChatTemplate())
	}
	if got := tok.Encode("hello world<tool>", true, false); !slices.Equal(got, []int32{bos, id("hello"), id("Ġworld"), tool}) {
		t.Errorf("Encode = %v", got)
	}
	if tok.VocabSize() != int(tool)+1 || tok.TokenText(tool-1) != "" {
		t.Errorf("the gap before <tool> is not an empty, unused entry")
	}
	// add_bos_token in tokenizer_config.json wins over the post-processor.
	tok, err = hfFrom(t, miniHFByteLevel(), map[string]any{"add_bos_token": false})
	if err != nil || tok.AddBOS() || tok.BOS() != bos {
		t.Fatalf("add_bos_token false: AddBOS %v BOS %d err %v", tok.AddBOS(), tok.BOS(), err)
	}
	tok.AddEOG(5, -1, 1<<30)
	if !tok.IsEOG(5) || !slices.Contains(tok.EOGs(), 5) {
		t.Error("AddEOG did not add")
	}
}

func TestHFSyntheticMetaspace(t *testing.T) {
	for _, tc := range []struct {
		scheme string
		split  bool
		text   string
		want   []string
	}{
		{"always", true, "ab ab", []string{"▁ab", "▁ab"}},
		{"always", false, "a b", []string{"▁a", "▁b"}},
		{"always", true, "<s>ab", []string{"<s>", "▁ab"}},
		{"first", true, "<s>ab", []string{"<s>", "ab"}},
		{"first", true, "ab<s>ab", []string{"▁ab", "<s>", "ab"}},
		{"never", true, "ab", []string{"ab"}},
		// "▁▁a" already starts with ▁: nothing is prepended.
		{"always", true, "  a", []string{"▁", "▁a"}},
		{"always", false, "  a", []string{"▁", "▁a"}}, // "▁ a" outranks "▁ ▁"
		{"always", false, "  ", []string{"▁▁"}},
		{"always", true, "aé", []string{"▁a", "<0xC3>", "<0xA9>"}},
	} {
		tok, err := hfFrom(t, miniHFMetaspace(tc.scheme, tc.split), map[string]any{"add_bos_token": false})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, id := range tok.Encode(tc.text, false, true) {
			got = append(got, tok.tokens[id])
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s split %v: %q -> %q, want %q", tc.scheme, tc.split, tc.text, got, tc.want)
		}
	}
	// Without byte fallback, unknown characters become one fused <unk>.
	tj := miniHFMetaspace("always", true)
	tj["model"].(map[string]any)["byte_fallback"] = false
	tok, err := hfFrom(t, tj, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("aéé", false, false); !slices.Equal(got, []int32{tok.toID["▁a"], 0}) {
		t.Errorf("unknown characters: %v", got)
	}
	if tok.AddBOS() || tok.BOS() != -1 {
		t.Errorf("no config: AddBOS %v BOS %d", tok.AddBOS(), tok.BOS())
	}
}

func TestHFErrors(t *testing.T) {
	mutate := func(f func(m map[string]any)) map[string]any {
		m := miniHFByteLevel()
		f(m)
		return m
	}
	model := func(m map[string]any) map[string]any { return m["model"].(map[string]any) }
	for name, tj := range map[string]map[string]any{
		"wordpiece":          mutate(func(m map[string]any) { model(m)["type"] = "WordPiece" }),
		"no vocab":           mutate(func(m map[string]any) { delete(model(m), "vocab") }),
		"bad merge":          mutate(func(m map[string]any) { model(m)["merges"] = []any{"nospace"} }),
		"merge out of vocab": mutate(func(m map[string]any) { model(m)["merges"] = []any{[]string{"x", "q"}} }),
		"huge id": mutate(func(m map[string]any) {
			m["added_tokens"] = []map[string]any{{"id": 1 << 40, "content": "x", "special": true}}
		}),
		"negative id":  mutate(func(m map[string]any) { model(m)["vocab"].(map[string]int)["zz"] = -1 }),
		"shared id":    mutate(func(m map[string]any) { model(m)["vocab"].(map[string]int)["zz"] = 5 }),
		"empty added":  mutate(func(m map[string]any) { m["added_tokens"] = []map[string]any{{"id": 3, "content": ""}} }),
		"unknown norm": mutate(func(m map[string]any) { m["normalizer"] = map[string]any{"type": "BertNormalizer"} }),
		"unknown pre":  mutate(func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Whitespace"} }),
		"bad regex": mutate(func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(a"}, "behavior": "Isolated"}
		}),
		"removed split": mutate(func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "a"}, "behavior": "Removed"}
		}),
		"suffix":        mutate(func(m map[string]any) { model(m)["end_of_word_suffix"] = "</w>" }),
		"not json":      nil,
		"deep sequence": mutate(func(m map[string]any) { m["normalizer"] = deepSequence(20) }),
		"regex pattern": mutate(func(m map[string]any) {
			m["normalizer"] = map[string]any{"type": "Replace", "pattern": map[string]any{"Regex": " "}}
		}),
		"split no ByteLv": mutate(func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Digits"} }),
	} {
		var err error
		if tj == nil {
			_, err = fromHF(hfFiles{Tokenizer: []byte("{")})
		} else {
			_, err = hfFrom(t, tj, nil)
		}
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		t.Logf("%s: %v", name, err)
	}
	// add_bos_token without a BOS token.
	if _, err := hfFrom(t, miniHFMetaspace("always", true), map[string]any{"add_bos_token": true, "bos_token": nil}); err == nil {
		t.Error("add_bos_token without a BOS accepted")
	}
	if _, err := FromHFDir(t.TempDir()); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("empty directory: %v", err)
	}
}

func deepSequence(depth int) map[string]any {
	if depth == 0 {
		return map[string]any{"type": "NFC"}
	}
	return map[string]any{"type": "Sequence", "normalizers": []any{deepSequence(depth - 1)}}
}

// generation_config.json's eos ids end generation too.
func TestHFGenerationConfigEOS(t *testing.T) {
	dir := t.TempDir()
	b, _ := json.Marshal(miniHFByteLevel())
	for name, data := range map[string]string{
		"tokenizer.json":         string(b),
		"generation_config.json": `{"eos_token_id": [104, 105]}`,
		"config.json":            `{"eos_token_id": 106}`,
		"chat_template.jinja":    "{{ bos_token }}",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := FromHFDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !tok.IsEOG(104) || !tok.IsEOG(105) || tok.IsEOG(106) || tok.ChatTemplate() != "{{ bos_token }}" {
		t.Errorf("EOGs %v template %q", tok.EOGs(), tok.ChatTemplate())
	}
	if err := os.Remove(filepath.Join(dir, "generation_config.json")); err != nil {
		t.Fatal(err)
	}
	if tok, err = FromHFDir(dir); err != nil || !tok.IsEOG(106) {
		t.Errorf("config.json eos: %v %v", tok.EOGs(), err)
	}
}

// FuzzTokenizerJSON feeds mutated tokenizer.json and tokenizer_config.json
// to the loader. It must never panic; a tokenizer it accepts must encode
// any text to ids in range and decode them to valid UTF-8 consistently.
func FuzzTokenizerJSON(f *testing.F) {
	seed := func(tj, cfg map[string]any) {
		b, _ := json.Marshal(tj)
		c, _ := json.Marshal(cfg)
		f.Add(b, c, "hello world <tool> 123 ab", true)
	}
	seed(miniHFByteLevel(), map[string]any{"bos_token": "<|begin_of_text|>"})
	seed(miniHFMetaspace("first", true), map[string]any{"add_bos_token": true, "bos_token": "<s>"})
	seed(miniHFMetaspace("always", false), nil)
	if b, err := os.ReadFile(filepath.Join(storiesHF, "tokenizer.json")); err == nil {
		c, _ := os.ReadFile(filepath.Join(storiesHF, "tokenizer_config.json"))
		f.Add(b, c, "Once upon a time <s> é", false)
	}
	f.Fuzz(func(t *testing.T, tj, cfg []byte, text string, parseSpecial bool) {
		tok, err := fromHF(hfFiles{Tokenizer: tj, Config: cfg})
		if err != nil {
			return
		}
		ids := tok.Encode(text, true, parseSpecial)
		for _, id := range ids {
			if id < 0 || int(id) >= tok.VocabSize() {
				t.Fatalf("Encode(%q) gave id %d outside [0,%d)", text, id, tok.VocabSize())
			}
		}
		d := checkDecode(t, tok, ids)
		if !utf8.ValidString(d) {
			t.Fatalf("invalid UTF-8 %q", d)
		}
		_ = tok.Detokenize(ids, true, true)
	})
}
