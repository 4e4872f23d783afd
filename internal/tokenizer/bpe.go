package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"

	"github.com/batonlm/baton/internal/gguf"
)

// byteEncode maps each byte to the printable character GPT-2 uses for it
// in its vocabulary (bytes_to_unicode); byteDecodeMap is the inverse.
var (
	byteEncode    [256]string
	byteDecodeMap = map[rune]byte{}
)

func init() {
	n := 0
	for b := range 256 {
		r := rune(b)
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if !printable {
			r = rune(256 + n)
			n++
		}
		byteEncode[b] = string(r)
		byteDecodeMap[r] = byte(b)
	}
}

// byteDecode turns a byte-level token's text back into the bytes it
// stands for. Characters outside the table (possible only in hand-made
// vocabularies) are kept as their own UTF-8.
func byteDecode(s string) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if c, ok := byteDecodeMap[r]; ok {
			b = append(b, c)
		} else {
			b = utf8.AppendRune(b, r)
		}
	}
	return string(b)
}

type mergeKey struct{ left, right string }

func (t *Tokenizer) loadMerges(f *gguf.File) error {
	merges, ok := f.Strings("tokenizer.ggml.merges")
	if !ok {
		return fmt.Errorf("tokenizer: gpt2 vocabulary without tokenizer.ggml.merges")
	}
	t.merges = make(map[mergeKey]int32, len(merges))
	for i, m := range merges {
		// The separator is the first space after the first byte, so a
		// merge whose left half starts with a space still splits right.
		var k mergeKey
		if len(m) > 1 {
			if j := strings.IndexByte(m[1:], ' '); j >= 0 {
				k = mergeKey{m[:j+1], m[j+2:]}
			}
		}
		if _, dup := t.merges[k]; !dup {
			t.merges[k] = int32(i)
		}
	}
	return nil
}

// encodeBPE pre-tokenizes text and merges each word by rank.
func (t *Tokenizer) encodeBPE(text string, out []int32) []int32 {
	var (
		sb   strings.Builder
		syms []symbol
		h    bigramHeap
	)
	for _, word := range t.pre.split(text) {
		sb.Reset()
		for i := 0; i < len(word); i++ {
			sb.WriteString(byteEncode[word[i]])
		}
		w := sb.String()
		if t.ignoreMerges {
			if id, ok := t.toID[w]; ok {
				out = append(out, id)
				continue
			}
		}
		syms = splitSymbols(w, syms)
		h = h[:0]
		tryAdd := func(left, right int32) {
			if left < 0 || right < 0 {
				return
			}
			l, r := syms[left], syms[right]
			rank, ok := t.merges[mergeKey{w[l.start : l.start+l.n], w[r.start : r.start+r.n]}]
			if !ok {
				return
			}
			h.push(bigram{key: -float64(rank), left: left, right: right, size: l.n + r.n})
		}
		mergeAll(syms, &h, tryAdd)
		for i := int32(0); i != -1; i = syms[i].next {
			sym := syms[i]
			piece := w[sym.start : sym.start+sym.n]
			if id, ok := t.toID[piece]; ok {
				out = append(out, id)
				continue
			}
			// Not a token (a vocabulary missing some byte characters):
			// fall back to the single characters, dropping unknown ones
			// as llama.cpp does.
			for _, r := range piece {
				if id, ok := t.toID[string(r)]; ok {
					out = append(out, id)
				} else if t.unk >= 0 {
					out = append(out, t.unk)
				}
			}
		}
	}
	return out
}

// preTokenizer splits text into the words BPE merges within. Each regex
// further splits the pieces left by the one before; text between matches
// is kept as a piece of its own, as llama.cpp's unicode_regex_split does.
type preTokenizer struct {
	res          []*regexp2.Regexp
	ignoreMerges bool
	addBOS       bool
	cleanSpaces  bool
}

// Pre-tokenizer regexes, as llama.cpp adapts them from the models'
// tokenizer.json files: case-insensitive contractions are spelled out
// because the (?i:) group is not portable.
const (
	gpt2Regex      = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	gpt2NoWSRegex  = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
	contractionsCI = `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])`
	llama3Regex    = contractionsCI + `|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Regex     = contractionsCI + `|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	gpt4oRegex     = `[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+` + contractionsCI + `?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*` + contractionsCI + `?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	tekkenRegex    = `[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// newPreTokenizer picks the pre-tokenizer for a tokenizer.ggml.pre value,
// with the flags llama.cpp sets alongside it.
func newPreTokenizer(name string) (*preTokenizer, error) {
	p := &preTokenizer{cleanSpaces: true}
	var exprs []string
	switch name {
	case "", "default":
		// llama.cpp's fallback for files that do not name a pre-tokenizer.
		exprs = []string{`[\p{P}\$\+<=>\^~\|]+`, gpt2NoWSRegex, `\p{N}+`, `[0-9][0-9][0-9]`}
	case "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
		"mpt", "olmo", "jais", "trillion", "exaone4", "a.x-4.0", "mellum":
		exprs = []string{gpt2Regex}
	case "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2":
		exprs = []string{llama3Regex}
		p.ignoreMerges = true
		p.addBOS = true
	case "dbrx", "smaug-bpe":
		exprs = []string{llama3Regex}
	case "qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan":
		exprs = []string{qwen2Regex}
		p.cleanSpaces = name == "stablelm2" || name == "megrez"
	case "glm4", "chatglm-bpe":
		exprs = []string{llama3Regex}
	case "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b":
		exprs = []string{`\p{N}`, gpt2NoWSRegex}
		p.cleanSpaces = name != "command-r" && name != "smollm"
	case "gpt-4o", "llama4":
		exprs = []string{gpt4oRegex}
		p.cleanSpaces = false
	case "tekken":
		exprs = []string{tekkenRegex}
		p.ignoreMerges = true
		p.addBOS = true
		p.cleanSpaces = false
	default:
		return nil, fmt.Errorf("tokenizer: unsupported pre-tokenizer %q", name)
	}
	for _, e := range exprs {
		re, err := regexp2.Compile(e, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: pre-tokenizer %q: %w", name, err)
		}
		p.res = append(p.res, re)
	}
	return p, nil
}

// split returns the words of text as substrings of it.
func (p *preTokenizer) split(text string) []string {
	// The regexes run on runes, so work out every rune's byte offset once;
	// malformed bytes count as U+FFFD for matching but keep their bytes.
	runes := make([]rune, 0, len(text))
	offs := make([]int, 0, len(text)+1)
	for i := 0; i < len(text); {
		r, n := utf8.DecodeRuneInString(text[i:])
		runes = append(runes, r)
		offs = append(offs, i)
		i += n
	}
	offs = append(offs, len(text))

	// Pieces are rune index ranges [start, end).
	type span struct{ start, end int }
	pieces := []span{{0, len(runes)}}
	if len(runes) == 0 {
		return nil
	}
	for _, re := range p.res {
		var next []span
		for _, pc := range pieces {
			sub := runes[pc.start:pc.end]
			pos := 0
			m, err := re.FindRunesMatch(sub)
			for err == nil && m != nil {
				if m.Index > pos {
					next = append(next, span{pc.start + pos, pc.start + m.Index})
				}
				if m.Length > 0 {
					next = append(next, span{pc.start + m.Index, pc.start + m.Index + m.Length})
				}
				pos = m.Index + m.Length
				m, err = re.FindNextMatch(m)
			}
			if pos < len(sub) {
				next = append(next, span{pc.start + pos, pc.end})
			}
		}
		pieces = next
	}
	words := make([]string, len(pieces))
	for i, pc := range pieces {
		words[i] = text[offs[pc.start]:offs[pc.end]]
	}
	return words
}
