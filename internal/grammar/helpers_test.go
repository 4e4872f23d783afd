package grammar

import (
	"math/bits"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/bundled"
	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/tokenizer"
)

var vocabFiles = map[string]string{
	"llama-spm": "../../testdata/vocab/ggml-vocab-llama-spm.gguf",
	"gpt-2":     "../../testdata/vocab/ggml-vocab-gpt-2.gguf",
}

var (
	tokMu  sync.Mutex
	tokens = map[string]*tokenizer.Tokenizer{}
)

// loadTok opens a test vocabulary once per test binary.
func loadTok(tb testing.TB, name string) *tokenizer.Tokenizer {
	tb.Helper()
	tokMu.Lock()
	defer tokMu.Unlock()
	if t, ok := tokens[name]; ok {
		return t
	}
	var t *tokenizer.Tokenizer
	var err error
	switch name {
	case "stories260K":
		var f *gguf.File
		f, err = gguf.Parse(bundled.Stories260K)
		if err == nil {
			t, err = tokenizer.FromGGUF(f)
		}
	case "qwen3":
		t, err = tokenizer.FromHFDir("../../testdata/tokenizers/qwen3")
	default:
		var f *gguf.File
		f, err = gguf.Open(vocabFiles[name])
		if err == nil {
			t, err = tokenizer.FromGGUF(f)
		}
	}
	if err != nil {
		tb.Fatal(err)
	}
	tokens[name] = t
	return t
}

func maskHas(mask []uint64, id int32) bool { return mask[id>>6]&(1<<(id&63)) != 0 }

func maskList(mask []uint64) []int32 {
	var out []int32
	for i, x := range mask {
		for x != 0 {
			b := bits.TrailingZeros64(x)
			out = append(out, int32(i*64+b))
			x &= x - 1
		}
	}
	return out
}

// sample draws tokens under the mask until the matcher ends or limit
// tokens. Draws favour the end, tokens that contain a closing or
// separating byte, and single bytes, so random text reaches the end of
// strings, numbers and runs of a class in a reasonable number of steps.
func sample(tb testing.TB, c *Compiled, rng *rand.Rand, limit int) (ids []int32, done bool) {
	tb.Helper()
	m := c.NewMatcher()
	mask := make([]uint64, c.MaskWords())
	for len(ids) < limit {
		m.FillMask(mask)
		allowed := maskList(mask)
		if len(allowed) == 0 {
			tb.Fatalf("nothing allowed after %q", c.v.text(ids))
		}
		var pick int32
		eog := allowed[:0:0]
		closers := allowed[:0:0]
		short := allowed[:0:0]
		for _, id := range allowed {
			if c.v.isEOG[id] {
				eog = append(eog, id)
				continue
			}
			if len(c.v.bytes[id]) == 1 {
				short = append(short, id)
			}
			for _, b := range c.v.bytes[id] {
				if b == '"' || b == ']' || b == '}' || b == ',' || b == ')' || b == ';' {
					closers = append(closers, id)
					break
				}
			}
		}
		switch {
		case len(eog) > 0 && rng.IntN(2) == 0:
			pick = eog[rng.IntN(len(eog))]
		case len(closers) > 0 && rng.IntN(2) == 0:
			pick = closers[rng.IntN(len(closers))]
		case len(short) > 0 && rng.IntN(2) == 0:
			pick = short[rng.IntN(len(short))]
		default:
			pick = allowed[rng.IntN(len(allowed))]
		}
		if err := m.Accept(pick); err != nil {
			tb.Fatalf("masked token refused after %q: %v", c.v.text(ids), err)
		}
		ids = append(ids, pick)
		if m.IsTerminated() {
			return ids, true
		}
	}
	return ids, false
}

// text is the bytes of ids, end-of-generation tokens left out.
func (v *vocab) text(ids []int32) string {
	var b []byte
	for _, id := range ids {
		b = append(b, v.bytes[id]...)
	}
	return string(b)
}

func mustCompile(tb testing.TB, g *Grammar, tok *tokenizer.Tokenizer) *Compiled {
	tb.Helper()
	c, err := Compile(g, tok)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}
