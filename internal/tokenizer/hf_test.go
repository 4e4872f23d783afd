package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/tokenizer/chat"
	testref "github.com/batonlm/baton/test/reference"
)

const (
	qwen3Dir   = "../../testdata/tokenizers/qwen3"
	storiesHF  = "../../testdata/stories260K-hf"
	qwen2Cases = "../../testdata/vocab/ggml-vocab-qwen2.gguf"
)

// loadHF opens a tokenizer directory once per test binary.
func loadHF(tb testing.TB, dir string) *Tokenizer {
	tb.Helper()
	loadMu.Lock()
	defer loadMu.Unlock()
	if t, ok := loaded["hf:"+dir]; ok {
		return t
	}
	t, err := FromHFDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	loaded["hf:"+dir] = t
	return t
}

// The Qwen3 tokenizer.json reproduces llama.cpp's Qwen2 vectors (what the
// Hugging Face tokenizer gives with add_special_tokens false) and decodes
// each back to its text.
func TestHFQwen3Vectors(t *testing.T) {
	tok := loadHF(t, qwen3Dir)
	cases := readVectors(t, qwen2Cases)
	pass := 0
	for i, c := range cases {
		got := tok.Encode(c.text, false, false)
		if !slices.Equal(got, c.ids) {
			t.Errorf("case %d %q:\n got  %v\n want %v", i, c.text, got, c.ids)
			continue
		}
		if d := tok.Decode(got); d != c.text {
			t.Errorf("case %d: Decode = %q, want %q", i, d, c.text)
			continue
		}
		pass++
	}
	t.Logf("qwen3 tokenizer.json: %d/%d vectors match", pass, len(cases))
	if len(cases) != 46 {
		t.Fatalf("%d vectors, want 46", len(cases))
	}
}

func TestHFQwen3Specials(t *testing.T) {
	tok := loadHF(t, qwen3Dir)
	if tok.Source() != "tokenizer.json" || tok.Model() != "gpt2" || tok.VocabSize() != 151669 {
		t.Fatalf("source %q model %q vocab %d", tok.Source(), tok.Model(), tok.VocabSize())
	}
	if tok.BOS() != -1 || tok.AddBOS() || tok.AddEOS() || tok.EOS() != 151645 || tok.TokenText(tok.EOS()) != "<|im_end|>" {
		t.Fatalf("BOS %d AddBOS %v AddEOS %v EOS %d", tok.BOS(), tok.AddBOS(), tok.AddEOS(), tok.EOS())
	}
	for _, id := range []int32{151643, 151645} {
		if !tok.IsEOG(id) || !tok.IsControl(id) {
			t.Errorf("%d: IsEOG %v IsControl %v", id, tok.IsEOG(id), tok.IsControl(id))
		}
	}
	if tok.IsEOG(151644) || tok.IsEOG(151667) || tok.IsControl(151667) {
		t.Error("<|im_start|> or <think> ends generation, or <think> is a control token")
	}
	if !strings.Contains(tok.ChatTemplate(), "<think>") {
		t.Error("no chat template")
	}
	// Special tokens are parsed only when asked; <think> (not special) always.
	const text = "<|im_start|>user\n<think>x</think><|im_end|>"
	with := tok.Encode(text, true, true)
	if want := []int32{151644, 872, 198, 151667, 87, 151668, 151645}; !slices.Equal(with, want) {
		t.Errorf("parseSpecial: %v, want %v", with, want)
	}
	without := tok.Encode(text, true, false)
	if slices.Contains(without, 151644) || slices.Contains(without, 151645) || !slices.Contains(without, 151667) {
		t.Errorf("without parseSpecial: %v", without)
	}
	if got := tok.Decode(without); got != text {
		t.Errorf("Decode(without) = %q", got)
	}
	// Decoding drops control tokens and keeps <think>, as
	// skip_special_tokens does (the README's transformers.js example).
	ids := tok.Encode("<think>\nhi\n</think>\n\n<|im_end|>", false, true)
	if want := []int32{151667, 198, 6023, 198, 151668, 271, 151645}; !slices.Equal(ids, want) {
		t.Errorf("think ids %v, want %v", ids, want)
	}
	if got := tok.Decode(ids); got != "<think>\nhi\n</think>\n\n" {
		t.Errorf("Decode = %q", got)
	}
	if tok.TokenText(151645) != "<|im_end|>" || tok.TokenText(9707) != "Hello" || tok.TokenText(220) != " " {
		t.Errorf("TokenText: %q %q %q", tok.TokenText(151645), tok.TokenText(9707), tok.TokenText(220))
	}
	// NFC: a decomposed ä encodes like the composed one.
	if a, b := tok.Encode("A\u0308pfel", false, false), tok.Encode("Äpfel", false, false); !slices.Equal(a, b) {
		t.Errorf("NFC: %v vs %v", a, b)
	}
}

type chatCase struct {
	Name     string         `json:"name"`
	Messages []chat.Message `json:"messages"`
	Rendered string         `json:"rendered"`
	TokenIDs []int32        `json:"token_ids"`
}

// The Qwen3 chat template renders the five recorded conversations exactly,
// and the rendered strings tokenize to the recorded ids.
func TestHFQwen3ChatTemplateCases(t *testing.T) {
	tok := loadHF(t, qwen3Dir)
	b, err := os.ReadFile(filepath.Join(qwen3Dir, "chat-template-cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []chatCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Cases) != 5 {
		t.Fatalf("%d cases, want 5", len(file.Cases))
	}
	tpl, err := chat.New(tok.ChatTemplate(), tok.TokenText(tok.BOS()), tok.TokenText(tok.EOS()))
	if err != nil {
		t.Fatal(err)
	}
	pass := 0
	for _, c := range file.Cases {
		got, err := tpl.Render(c.Messages, true)
		if err != nil || got != c.Rendered {
			t.Errorf("%s: rendered %q (%v)\nwant %q", c.Name, got, err, c.Rendered)
			continue
		}
		// As the server encodes a chat prompt: special tokens parsed, BOS
		// as the tokenizer says (Qwen3 adds none).
		if ids := tok.Encode(got, true, true); !slices.Equal(ids, c.TokenIDs) {
			t.Errorf("%s: ids %v\nwant %v", c.Name, ids, c.TokenIDs)
			continue
		}
		if d := tok.Detokenize(c.TokenIDs, false, true); d != c.Rendered {
			t.Errorf("%s: Detokenize = %q", c.Name, d)
			continue
		}
		pass++
	}
	t.Logf("qwen3 chat template: %d/%d cases match", pass, len(file.Cases))
}

// The stories260K tokenizer.json gives the same tokenizer as the GGUF's
// vocabulary: same ids for every test string and the reference prompt,
// same BOS/EOS, same rendering.
func TestHFStoriesMatchesGGUF(t *testing.T) {
	hf, gg := loadHF(t, storiesHF), load(t, storiesVocab)
	if hf.VocabSize() != gg.VocabSize() || hf.BOS() != gg.BOS() || hf.EOS() != gg.EOS() || hf.AddBOS() != gg.AddBOS() ||
		hf.AddEOS() != gg.AddEOS() || hf.Model() != "llama" || hf.ChatTemplate() != "" {
		t.Fatalf("HF vocab %d BOS %d EOS %d AddBOS %v, GGUF vocab %d BOS %d EOS %d AddBOS %v",
			hf.VocabSize(), hf.BOS(), hf.EOS(), hf.AddBOS(), gg.VocabSize(), gg.BOS(), gg.EOS(), gg.AddBOS())
	}
	if got := hf.Encode("Once upon a time", true, false); !slices.Equal(got, []int32{1, 403, 407, 261, 378}) {
		t.Fatalf("prompt ids %v", got)
	}
	texts := []string{"Lily and Ben went to the park. They", "<s>Lily", "a<s>b</s>c", "", " ", "  x  ", "\t\n", "ÄÖÜ 好 😀 ▁▁a"}
	for _, c := range readVectors(t, spmVocab) {
		texts = append(texts, c.text)
	}
	for _, s := range texts {
		for _, special := range []bool{false, true} {
			a, b := hf.Encode(s, true, special), gg.Encode(s, true, special)
			if !slices.Equal(a, b) {
				t.Errorf("%q (parseSpecial %v): HF %v, GGUF %v", s, special, a, b)
			}
			if hf.Decode(a) != gg.Decode(b) || hf.Detokenize(a, true, false) != gg.Detokenize(b, true, false) {
				t.Errorf("%q: decodings differ", s)
			}
		}
	}
	for id := int32(0); id < int32(hf.VocabSize()); id++ {
		if hf.TokenText(id) != gg.TokenText(id) || hf.IsControl(id) != gg.IsControl(id) || hf.IsEOG(id) != gg.IsEOG(id) {
			t.Fatalf("token %d: HF %q control %v eog %v, GGUF %q control %v eog %v", id, hf.TokenText(id), hf.IsControl(id), hf.IsEOG(id),
				gg.TokenText(id), gg.IsControl(id), gg.IsEOG(id))
		}
	}
	// The public reference: prompt + generated ids decode to its text.
	ref := testref.Load(t)
	if got := hf.Encode(ref.Prompt, true, false); !slices.Equal(got, ref.PromptIDs) {
		t.Fatalf("reference prompt ids %v, want %v", got, ref.PromptIDs)
	}
	whole := hf.Detokenize(append(slices.Clone(ref.PromptIDs[1:]), ref.GeneratedIDs...), false, false)
	if whole != ref.Prompt+ref.GeneratedText {
		t.Fatalf("decoded %q\nwant %q", whole, ref.Prompt+ref.GeneratedText)
	}
	if hf.Decode(ref.GeneratedIDs) != ref.GeneratedText {
		t.Fatalf("Decode(generated) = %q", hf.Decode(ref.GeneratedIDs))
	}
}

// tokenizerJSONFromGGUF writes a GGUF vocabulary as the tokenizer.json
// Hugging Face ships for it: GPT-2's byte-level BPE with its merges, or a
// Llama 2 SentencePiece BPE with merges derived from the scores the way
// transformers' SentencePieceExtractor does (every split of a piece into
// two pieces, ordered by the piece's score, then by the parts' ids).
func tokenizerJSONFromGGUF(t *testing.T, g *Tokenizer, merges []string) []byte {
	t.Helper()
	vocab := map[string]int{}
	var added []map[string]any
	for i, s := range g.tokens {
		vocab[s] = i
		if g.types[i] == typeControl || g.types[i] == typeUnknown {
			added = append(added, map[string]any{"id": i, "content": s, "special": true})
		}
	}
	tj := map[string]any{"added_tokens": added}
	if g.kind == kindBPE {
		tj["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
		tj["decoder"] = map[string]any{"type": "ByteLevel"}
		tj["model"] = map[string]any{"type": "BPE", "vocab": vocab, "merges": merges}
	} else {
		type split struct {
			l, r  string
			score float32
			li    int
			ri    int
		}
		var all []split
		for i, s := range g.tokens {
			if g.types[i] != typeNormal {
				continue
			}
			for j := range s {
				if j == 0 {
					continue
				}
				l, r := s[:j], s[j:]
				li, okl := vocab[l]
				ri, okr := vocab[r]
				if okl && okr && g.types[li] == typeNormal && g.types[ri] == typeNormal {
					all = append(all, split{l, r, g.scores[i], li, ri})
				}
			}
		}
		slices.SortStableFunc(all, func(a, b split) int {
			switch {
			case a.score != b.score:
				if a.score > b.score {
					return -1
				}
				return 1
			case a.li != b.li:
				return a.li - b.li
			}
			return a.ri - b.ri
		})
		pairs := make([][2]string, len(all))
		for i, s := range all {
			pairs[i] = [2]string{s.l, s.r}
		}
		tj["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"}}}
		tj["model"] = map[string]any{"type": "BPE", "vocab": vocab, "merges": pairs, "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true}
	}
	b, err := json.Marshal(tj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The GPT-2 and Llama 2 vocabularies, written as the tokenizer.json files
// Hugging Face ships for them, reproduce llama.cpp's test vectors through
// the tokenizer.json path: byte-level BPE with the ByteLevel regex, and
// SentencePiece-style BPE merged by rank with byte fallback.
func TestHFFromGGUFVocabVectors(t *testing.T) {
	for _, path := range []string{gpt2Vocab, spmVocab} {
		g := load(t, path)
		var merges []string
		if g.kind == kindBPE {
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			merges, _ = f.Strings("tokenizer.ggml.merges")
			merges = slices.Clone(merges)
			f.Close()
		}
		tok, err := fromHF(hfFiles{Tokenizer: tokenizerJSONFromGGUF(t, g, merges)})
		if err != nil {
			t.Fatal(err)
		}
		pass := 0
		cases := readVectors(t, path)
		for i, c := range cases {
			got := tok.Encode(c.text, false, false)
			if !slices.Equal(got, c.ids) {
				t.Errorf("%s case %d %q:\n got  %v\n want %v", path, i, c.text, got, c.ids)
				continue
			}
			pass++
		}
		t.Logf("%s as tokenizer.json: %d/%d vectors match", filepath.Base(path), pass, len(cases))
	}
}
