package tokenizer

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/batonlm/baton/internal/gguf"
)

const (
	spmVocab     = "../../testdata/vocab/ggml-vocab-llama-spm.gguf"
	gpt2Vocab    = "../../testdata/vocab/ggml-vocab-gpt-2.gguf"
	storiesVocab = "../bundled/stories260K.gguf"
)

var (
	loadMu sync.Mutex
	loaded = map[string]*Tokenizer{}
)

// load opens a vocabulary once per test binary; the GGUF stays mapped for
// the life of the process, which is fine in tests.
func load(tb testing.TB, path string) *Tokenizer {
	tb.Helper()
	loadMu.Lock()
	defer loadMu.Unlock()
	if t, ok := loaded[path]; ok {
		return t
	}
	f, err := gguf.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	t, err := FromGGUF(f)
	if err != nil {
		tb.Fatal(err)
	}
	loaded[path] = t
	return t
}

type vectorCase struct {
	text string
	ids  []int32
}

// readVectors parses llama.cpp's test-tokenizer-0 files.
func readVectors(t *testing.T, path string) []vectorCase {
	t.Helper()
	inp, err := os.ReadFile(path + ".inp")
	if err != nil {
		t.Fatal(err)
	}
	outp, err := os.ReadFile(path + ".out")
	if err != nil {
		t.Fatal(err)
	}
	texts := strings.Split(string(inp), "\n__ggml_vocab_test__\n")
	if texts[len(texts)-1] == "" {
		texts = texts[:len(texts)-1]
	}
	lines := strings.Split(strings.TrimSuffix(string(outp), "\n"), "\n")
	if len(texts) != len(lines) {
		t.Fatalf("%s: %d inputs but %d outputs", path, len(texts), len(lines))
	}
	cases := make([]vectorCase, len(texts))
	for i, s := range texts {
		cases[i].text = s
		for _, f := range strings.Fields(lines[i]) {
			v, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("%s.out line %d: %v", path, i+1, err)
			}
			cases[i].ids = append(cases[i].ids, int32(v))
		}
	}
	return cases
}

func testVectors(t *testing.T, path string) {
	tok := load(t, path)
	cases := readVectors(t, path)
	pass := 0
	for i, c := range cases {
		got := tok.Encode(c.text, false, false)
		if !slices.Equal(got, c.ids) {
			t.Errorf("case %d %q:\n got  %v\n want %v", i, c.text, got, c.ids)
			continue
		}
		pass++
	}
	t.Logf("%s: %d/%d vectors match", path, pass, len(cases))
}

func TestVectorsSPM(t *testing.T)  { testVectors(t, spmVocab) }
func TestVectorsGPT2(t *testing.T) { testVectors(t, gpt2Vocab) }

// TestRoundTripSPM checks what llama.cpp's test-tokenizer-1-spm checks:
// Detokenize (llama_detokenize) gives the text back, the space that
// encoding prepends being removed again. Decode keeps that space.
func TestRoundTripSPM(t *testing.T) {
	tok := load(t, spmVocab)
	for i, c := range readVectors(t, spmVocab) {
		ids := tok.Encode(c.text, false, false)
		if got := tok.Detokenize(ids, false, true); got != c.text {
			t.Errorf("case %d: Detokenize(Encode(%q)) = %q", i, c.text, got)
		}
		want := c.text
		if want != "" {
			want = " " + want
		}
		if got := tok.Decode(ids); got != want {
			t.Errorf("case %d: Decode(Encode(%q)) = %q, want %q", i, c.text, got, want)
		}
	}
}

// TestRoundTripGPT2 checks that byte-level BPE loses nothing. Detokenize
// applies clean_up_tokenization_spaces like llama.cpp, so texts with a
// space before punctuation do not survive it; Decode is exact.
func TestRoundTripGPT2(t *testing.T) {
	tok := load(t, gpt2Vocab)
	for i, c := range readVectors(t, gpt2Vocab) {
		ids := tok.Encode(c.text, false, false)
		if got := tok.Decode(ids); got != c.text {
			t.Errorf("case %d: Decode(Encode(%q)) = %q", i, c.text, got)
		}
		cleaned := string(cleanUpSpaces([]byte(c.text)))
		if got := tok.Detokenize(ids, false, true); got != cleaned {
			t.Errorf("case %d: Detokenize(Encode(%q)) = %q, want %q", i, c.text, got, cleaned)
		}
	}
}

func TestStoriesVocab(t *testing.T) {
	tok := load(t, storiesVocab)
	if !tok.AddBOS() || tok.BOS() != 1 || tok.EOS() != 2 {
		t.Fatalf("AddBOS=%v BOS=%d EOS=%d", tok.AddBOS(), tok.BOS(), tok.EOS())
	}
	got := tok.Encode("Once upon a time", true, false)
	if want := []int32{1, 403, 407, 261, 378}; !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	gen := []int32{432, 383, 286, 261, 376, 298, 315, 421, 395, 317}
	const want = ", there was a little girl named Lily"
	if got := tok.Decode(gen); got != want {
		t.Errorf("Decode = %q, want %q", got, want)
	}
	// The same through the stream decoder, chunk by chunk.
	d := tok.NewStreamDecoder()
	var sb strings.Builder
	for _, id := range gen {
		sb.WriteString(d.Push(id))
	}
	sb.WriteString(d.Flush())
	if sb.String() != want {
		t.Errorf("stream = %q, want %q", sb.String(), want)
	}
	if !tok.IsEOG(2) || tok.IsEOG(1) || tok.IsEOG(432) {
		t.Error("IsEOG wrong")
	}
	if s := tok.Decode([]int32{1, 383, 2}); s != " there" {
		t.Errorf("Decode with BOS/EOS = %q, want %q", s, " there")
	}
	if s := tok.TokenText(383); s != " there" {
		t.Errorf("TokenText(383) = %q", s)
	}
	if s := tok.TokenText(1); s != "<s>" {
		t.Errorf("TokenText(BOS) = %q", s)
	}
	if s := tok.TokenText(-1) + tok.TokenText(1<<20); s != "" {
		t.Errorf("TokenText out of range = %q", s)
	}
	// Whole-prompt decoding, llama.cpp style.
	prompt := tok.Encode("Once upon a time", true, false)
	if s := tok.Detokenize(prompt[1:], false, false); s != "Once upon a time" {
		t.Errorf("Detokenize without BOS = %q", s)
	}
	if s := tok.Detokenize(prompt, true, false); s != " Once upon a time" {
		t.Errorf("Detokenize dropping BOS = %q", s)
	}
	if s := tok.Detokenize(prompt, false, true); s != "<s> Once upon a time" {
		t.Errorf("Detokenize showing BOS = %q", s)
	}
}

func TestParseSpecial(t *testing.T) {
	tok := load(t, spmVocab)
	with := tok.Encode("<s>Hello</s>", false, true)
	if with[0] != 1 || with[len(with)-1] != 2 {
		t.Errorf("parseSpecial=true: %v", with)
	}
	// After a special token SentencePiece starts a new word: "Hello" gets
	// the same prefix space as at the start of the text.
	if hello := tok.Encode("Hello", false, false); !slices.Equal(with[1:len(with)-1], hello) {
		t.Errorf("inner tokens %v, want %v", with[1:len(with)-1], hello)
	}
	without := tok.Encode("<s>Hello</s>", false, false)
	if slices.Contains(without, 1) || slices.Contains(without, 2) {
		t.Errorf("parseSpecial=false produced control tokens: %v", without)
	}
	if got := tok.Decode(without); got != " <s>Hello</s>" {
		t.Errorf("Decode = %q", got)
	}

	g := load(t, gpt2Vocab)
	ids := g.Encode("a<|endoftext|>b", false, true)
	if len(ids) != 3 || ids[1] != 50256 {
		t.Errorf("gpt2 parseSpecial: %v", ids)
	}
	if !g.IsEOG(50256) || g.AddBOS() {
		t.Errorf("gpt2 IsEOG(50256)=%v AddBOS=%v", g.IsEOG(50256), g.AddBOS())
	}
	if got := g.Decode(ids); got != "ab" {
		t.Errorf("gpt2 Decode skips control: %q", got)
	}
	if got := g.Encode("a<|endoftext|>b", true, false); slices.Contains(got, 50256) {
		t.Errorf("gpt2 parseSpecial=false: %v", got)
	}
}

// TestStreamSplitsCharacters feeds a character that only byte fallback can
// spell and checks that nothing invalid is emitted in between.
func TestStreamSplitsCharacters(t *testing.T) {
	tok := load(t, storiesVocab)
	ids := tok.Encode("好 a😀b", false, false)
	d := tok.NewStreamDecoder()
	var chunks []string
	for _, id := range ids {
		c := d.Push(id)
		if !utf8.ValidString(c) {
			t.Fatalf("invalid chunk %q", c)
		}
		chunks = append(chunks, c)
	}
	chunks = append(chunks, d.Flush())
	if got := strings.Join(chunks, ""); got != " 好 a😀b" {
		t.Errorf("stream = %q (chunks %q)", got, chunks)
	}
	// A truncated character is replaced at the end, as Decode does.
	cut := ids[:len(ids)-2] // drops the last byte of 😀 and "b"
	d = tok.NewStreamDecoder()
	var sb strings.Builder
	for _, id := range cut {
		sb.WriteString(d.Push(id))
	}
	sb.WriteString(d.Flush())
	if sb.String() != tok.Decode(cut) || !utf8.ValidString(sb.String()) {
		t.Errorf("stream %q, Decode %q", sb.String(), tok.Decode(cut))
	}
}

func TestCleanUpSpaces(t *testing.T) {
	for in, want := range map[string]string{
		"Hello , world !":     "Hello, world!",
		"it 's a ' b ' c":     "it's a'b'c",
		"I 'm you 're we 've": "I'm you're we've",
		"don 't he 'd":        "don 't he 'd",
		"a ' ' b":             "a'' b",
		"":                    "",
	} {
		if got := string(cleanUpSpaces([]byte(in))); got != want {
			t.Errorf("cleanUpSpaces(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPreTokenizers(t *testing.T) {
	for _, name := range []string{"", "default", "gpt-2", "llama-bpe", "llama3", "qwen2", "starcoder", "gpt-4o", "tekken", "dbrx", "chatglm-bpe"} {
		p, err := newPreTokenizer(name)
		if err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		const text = "Hello, y'all! I'M  12345 \n\n\tdone  "
		if got := strings.Join(p.split(text), ""); got != text {
			t.Errorf("%q: split loses text: %q", name, got)
		}
	}
	if _, err := newPreTokenizer("no-such-thing"); err == nil {
		t.Error("unknown pre-tokenizer accepted")
	}
	p, _ := newPreTokenizer("llama3")
	if got := p.split("I'M 12345\n\n  x"); !slices.Equal(got, []string{"I", "'M", " ", "123", "45", "\n\n", " ", " x"}) {
		t.Errorf("llama3 split = %q", got)
	}
	p, _ = newPreTokenizer("qwen2")
	if got := p.split("ab 123"); !slices.Equal(got, []string{"ab", " ", "1", "2", "3"}) {
		t.Errorf("qwen2 split = %q", got)
	}
}

func TestLongPromptIsFast(t *testing.T) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. 0123456789 ", 80)[:4000]
	for _, path := range []string{spmVocab, gpt2Vocab} {
		tok := load(t, path)
		ids := tok.Encode(text, false, false)
		if len(ids) == 0 {
			t.Fatal("no tokens")
		}
		if tok.kind == kindBPE && tok.Decode(ids) != text {
			t.Error("round trip failed")
		}
	}
}

func benchmarkEncode(b *testing.B, path string) {
	tok := load(b, path)
	text := strings.Repeat("The quick brown fox jumps over the lazy dog, y'all! Ünïcödé 1234 ", 70)[:4000]
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for b.Loop() {
		tok.Encode(text, true, false)
	}
}

func BenchmarkEncode4000SPM(b *testing.B)  { benchmarkEncode(b, spmVocab) }
func BenchmarkEncode4000GPT2(b *testing.B) { benchmarkEncode(b, gpt2Vocab) }

func BenchmarkFromGGUFGPT2(b *testing.B) {
	f, err := gguf.Open(gpt2Vocab)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	for b.Loop() {
		if _, err := FromGGUF(f); err != nil {
			b.Fatal(err)
		}
	}
}
