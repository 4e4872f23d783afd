package tokenizer

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/gguf"
)

// ggufBytes serialises metadata into a tensor-less GGUF image. Values may be
// string, uint32, bool, []string, []int32 or []float32.
func ggufBytes(t *testing.T, kv map[string]any) []byte {
	t.Helper()
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { w(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	w(uint32(3))
	w(uint64(0))
	w(uint64(len(kv)))
	for k, v := range kv {
		str(k)
		switch x := v.(type) {
		case string:
			w(uint32(8))
			str(x)
		case uint32:
			w(uint32(4))
			w(x)
		case bool:
			w(uint32(7))
			w(x)
		case []string:
			w(uint32(9))
			w(uint32(8))
			w(uint64(len(x)))
			for _, s := range x {
				str(s)
			}
		case []int32:
			w(uint32(9))
			w(uint32(5))
			w(uint64(len(x)))
			w(x)
		case []float32:
			w(uint32(9))
			w(uint32(6))
			w(uint64(len(x)))
			w(x)
		default:
			t.Fatalf("unsupported value %T", v)
		}
	}
	return b.Bytes()
}

// miniBPE is a tiny byte-level vocabulary in the style of Qwen: every byte,
// a few merges and added tokens of each kind.
func miniBPE(t *testing.T, pre string, extra map[string]any) (*Tokenizer, error) {
	t.Helper()
	var tokens []string
	var types []int32
	for c := range 256 {
		tokens = append(tokens, byteEncode[c])
		types = append(types, typeNormal)
	}
	merges := []string{"h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d"}
	for _, m := range merges {
		tokens = append(tokens, strings.ReplaceAll(m, " ", ""))
		types = append(types, typeNormal)
	}
	specials := []struct {
		text string
		typ  int32
	}{
		{"<|endoftext|>", typeControl}, {"<|im_start|>", typeControl},
		{"<|im_end|>", typeNormal}, // mislabelled, as some converters do
		{"<think>", typeUserDefined},
	}
	for _, s := range specials {
		tokens = append(tokens, s.text)
		types = append(types, s.typ)
	}
	kv := map[string]any{
		"tokenizer.ggml.model":        "gpt2",
		"tokenizer.ggml.pre":          pre,
		"tokenizer.ggml.tokens":       tokens,
		"tokenizer.ggml.token_type":   types,
		"tokenizer.ggml.merges":       merges,
		"tokenizer.ggml.eos_token_id": uint32(len(tokens) - 4),
		"tokenizer.chat_template":     "{{ messages }}",
	}
	for k, v := range extra {
		if v == nil {
			delete(kv, k)
		} else {
			kv[k] = v
		}
	}
	f, err := gguf.Parse(ggufBytes(t, kv))
	if err != nil {
		t.Fatal(err)
	}
	return FromGGUF(f)
}

func TestSyntheticBPE(t *testing.T) {
	tok, err := miniBPE(t, "qwen2", nil)
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
	hello, world := id("hello"), id("Ġworld")
	if got := tok.Encode("hello world", true, false); !slices.Equal(got, []int32{hello, world}) {
		t.Errorf("Encode = %v, want [%d %d]", got, hello, world)
	}
	if tok.AddBOS() || tok.BOS() != -1 || tok.ChatTemplate() != "{{ messages }}" {
		t.Errorf("AddBOS=%v BOS=%d template=%q", tok.AddBOS(), tok.BOS(), tok.ChatTemplate())
	}
	// User-defined tokens are matched even without parseSpecial; control
	// tokens only with it.
	think, imStart, imEnd, eot := id("<think>"), id("<|im_start|>"), id("<|im_end|>"), id("<|endoftext|>")
	if got := tok.Encode("hello<think>", false, false); !slices.Equal(got, []int32{hello, think}) {
		t.Errorf("user-defined: %v", got)
	}
	if got := tok.Encode("<|im_start|>hello", false, false); slices.Contains(got, imStart) {
		t.Errorf("control parsed without parseSpecial: %v", got)
	}
	if got := tok.Encode("<|im_start|>hello<|im_end|>", false, true); !slices.Equal(got, []int32{imStart, hello, imEnd}) {
		t.Errorf("parseSpecial: %v", got)
	}
	// <|im_end|> ends a turn and, though mislabelled, is treated as control.
	if !tok.IsEOG(imEnd) || !tok.IsEOG(eot) || tok.IsEOG(imStart) || tok.EOT() != imEnd {
		t.Errorf("IsEOG(im_end)=%v IsEOG(eos)=%v EOT=%d", tok.IsEOG(imEnd), tok.IsEOG(eot), tok.EOT())
	}
	if got := tok.Decode([]int32{imStart, hello, think, imEnd}); got != "hello<think>" {
		t.Errorf("Decode = %q", got)
	}
	if got := tok.TokenText(imEnd); got != "<|im_end|>" {
		t.Errorf("TokenText(im_end) = %q", got)
	}

	// llama3-style pre-tokenizers add BOS unless the file says otherwise.
	extra := map[string]any{"tokenizer.ggml.bos_token_id": uint32(imStart)}
	if tok, err := miniBPE(t, "llama-bpe", extra); err != nil || !tok.AddBOS() {
		t.Errorf("llama-bpe: AddBOS=%v err=%v", tok != nil && tok.AddBOS(), err)
	}
	extra["tokenizer.ggml.add_bos_token"] = false
	if tok, err := miniBPE(t, "llama-bpe", extra); err != nil || tok.AddBOS() {
		t.Errorf("llama-bpe with add_bos_token=false: err=%v", err)
	}
	if _, err := miniBPE(t, "llama-bpe", nil); err == nil {
		t.Error("add_bos without a BOS token accepted")
	}
}

func TestFromGGUFErrors(t *testing.T) {
	for name, extra := range map[string]map[string]any{
		"unknown pre":     {"tokenizer.ggml.pre": "klingon"},
		"unknown model":   {"tokenizer.ggml.model": "t5"},
		"no model":        {"tokenizer.ggml.model": nil},
		"no tokens":       {"tokenizer.ggml.tokens": nil},
		"no merges":       {"tokenizer.ggml.merges": nil},
		"duplicate token": {"tokenizer.ggml.tokens": []string{"a", "a"}, "tokenizer.ggml.token_type": []int32{1, 1}},
		"short types":     {"tokenizer.ggml.token_type": []int32{1}},
		"short scores":    {"tokenizer.ggml.scores": []float32{0}},
	} {
		_, err := miniBPE(t, "qwen2", extra)
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		t.Logf("%s: %v", name, err)
	}
}

func TestGPTOSSEnd(t *testing.T) {
	tokens := []string{"a", "<|end|>", "<|return|>", "<|call|>"}
	f, err := gguf.Parse(ggufBytes(t, map[string]any{
		"tokenizer.ggml.model":        "gpt2",
		"tokenizer.ggml.pre":          "gpt-4o",
		"tokenizer.ggml.tokens":       tokens,
		"tokenizer.ggml.token_type":   []int32{1, 3, 3, 3},
		"tokenizer.ggml.merges":       []string{},
		"tokenizer.ggml.eos_token_id": uint32(2),
	}))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	if tok.IsEOG(1) || !tok.IsEOG(2) || !tok.IsEOG(3) {
		t.Errorf("IsEOG <|end|>=%v <|return|>=%v <|call|>=%v", tok.IsEOG(1), tok.IsEOG(2), tok.IsEOG(3))
	}
	if got := tok.Decode([]int32{0, 1, 0, 2}); got != "a<|end|>a" {
		t.Errorf("Decode = %q", got)
	}
}
