// Package tokenizer turns text into token ids and back, using the vocabulary
// stored in a GGUF file (FromGGUF) or a Hugging Face model directory's
// tokenizer.json (FromHFDir; see hf.go).
//
// Two vocabulary kinds are supported, the same ones llama.cpp calls SPM and
// BPE:
//
//   - tokenizer.ggml.model = "llama": SentencePiece-style BPE. Spaces become
//     "▁", a space is prepended to each run of text, pairs are merged by token
//     score and anything left unmerged falls back to <0xNN> byte tokens.
//   - tokenizer.ggml.model = "gpt2": byte-level BPE. Text is first split by a
//     pre-tokenizer regex chosen by tokenizer.ggml.pre, each piece is mapped
//     through the GPT-2 byte-to-unicode table and merged by
//     tokenizer.ggml.merges rank.
//
// The results match llama.cpp token for token on its vocabulary test vectors
// (testdata/vocab), from GGUF and from tokenizer.json alike. Decoding has two flavours: Decode and the StreamDecoder
// render generated tokens exactly as they are, keeping a continuation's
// leading space, while Detokenize mirrors llama_detokenize for decoding a
// whole prompt (it drops the space SentencePiece prepended and, for GPT-2
// style vocabularies, applies clean_up_tokenization_spaces).
package tokenizer

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/batonlm/baton/internal/gguf"
)

// Token types as stored in tokenizer.ggml.token_type.
const (
	typeUndefined   = 0
	typeNormal      = 1
	typeUnknown     = 2
	typeControl     = 3
	typeUserDefined = 4
	typeUnused      = 5
	typeByte        = 6
)

type kind int

const (
	kindSPM kind = iota
	kindBPE
)

// Tokenizer encodes and decodes text for one vocabulary. Once built (and
// any AddEOG calls made) it is immutable and safe for concurrent use.
type Tokenizer struct {
	kind   kind
	model  string
	source string   // gguf or tokenizer.json
	tokens []string // raw vocabulary text
	scores []float32
	types  []int32
	toID   map[string]int32
	// pieces holds each token's rendered text with special tokens shown,
	// computed once because decoding happens for every generated token.
	pieces []string

	bos, eos, eot, eom, unk int32
	addBOS, addEOS          bool
	addSpacePrefix          bool // SPM: prepend a space to each text run
	cleanSpaces             bool // BPE: clean_up_tokenization_spaces in Detokenize
	eog                     map[int32]bool

	// special lists the tokens matched literally in the input before BPE,
	// longest first so that a longer token wins over its own prefix.
	special []int32
	// controlByFirst lists the control and unknown tokens (those that
	// parseSpecial governs) by their first byte, for EscapeSpecial.
	controlByFirst [256][]int32

	byteTok [256]int32 // byte fallback ids, -1 where the vocab lacks one

	// BPE only.
	merges       map[mergeKey]int32
	pre          *preTokenizer
	ignoreMerges bool

	chatTemplate string

	fpOnce sync.Once
	fp     string // Fingerprint, computed once

	// hf is set for tokenizers built from tokenizer.json: how each text
	// run is normalized, and merges (above) are applied by rank for
	// SentencePiece-style vocabularies too.
	hf *hfText
}

// FromGGUF builds a tokenizer from the tokenizer.* metadata of a GGUF file.
func FromGGUF(f *gguf.File) (*Tokenizer, error) {
	model, ok := f.String("tokenizer.ggml.model")
	if !ok {
		return nil, errors.New("tokenizer: tokenizer.ggml.model missing")
	}
	tokens, ok := f.Strings("tokenizer.ggml.tokens")
	if !ok || len(tokens) == 0 {
		return nil, errors.New("tokenizer: tokenizer.ggml.tokens missing")
	}
	if len(tokens) > 1<<30 {
		return nil, fmt.Errorf("tokenizer: %d tokens is implausible", len(tokens))
	}
	n := len(tokens)
	t := &Tokenizer{
		model:  model,
		source: "gguf",
		tokens: slices.Clone(tokens),
		scores: make([]float32, n),
		types:  make([]int32, n),
		toID:   make(map[string]int32, n),
		bos:    -1, eos: -1, eot: -1, eom: -1, unk: -1,
		eog: map[int32]bool{},
	}
	t.chatTemplate, _ = f.String("tokenizer.chat_template")

	if sc, ok := f.Meta["tokenizer.ggml.scores"]; ok {
		switch v := sc.(type) {
		case []float32:
			if len(v) < n {
				return nil, fmt.Errorf("tokenizer: %d scores for %d tokens", len(v), n)
			}
			copy(t.scores, v)
		case []int32:
			if len(v) < n {
				return nil, fmt.Errorf("tokenizer: %d scores for %d tokens", len(v), n)
			}
			for i := range t.scores {
				t.scores[i] = float32(v[i])
			}
		default:
			return nil, fmt.Errorf("tokenizer: tokenizer.ggml.scores has type %T", sc)
		}
	}
	if _, present := f.Meta["tokenizer.ggml.token_type"]; present {
		tt, ok := f.Int32s("tokenizer.ggml.token_type")
		if !ok || len(tt) < n {
			return nil, fmt.Errorf("tokenizer: tokenizer.ggml.token_type is malformed or shorter than the %d tokens", n)
		}
		copy(t.types, tt[:n])
	} else {
		for i := range t.types {
			t.types[i] = typeNormal
		}
	}
	for i, s := range t.tokens {
		if s == "" {
			// An empty token could never be matched and would make the
			// special-token scan loop forever; llama.cpp renames it the same way.
			s = "[EMPTY_" + strconv.Itoa(i) + "]"
			t.tokens[i] = s
		}
		if prev, dup := t.toID[s]; dup {
			return nil, fmt.Errorf("tokenizer: duplicate token %q has ids %d and %d", s, prev, i)
		}
		t.toID[s] = int32(i)
	}

	pre, _ := f.String("tokenizer.ggml.pre")
	switch model {
	case "llama":
		t.kind = kindSPM
		t.bos, t.eos, t.unk = 1, 2, 0
		t.addSpacePrefix = true
		t.addBOS = true
	case "gpt2":
		t.kind = kindBPE
		if err := t.loadMerges(f); err != nil {
			return nil, err
		}
		p, err := newPreTokenizer(pre)
		if err != nil {
			return nil, err
		}
		t.pre = p
		t.ignoreMerges = p.ignoreMerges
		t.addBOS = p.addBOS
		t.cleanSpaces = p.cleanSpaces
	default:
		return nil, fmt.Errorf("tokenizer: unsupported tokenizer.ggml.model %q (want llama or gpt2)", model)
	}
	if v, ok := f.Bool("tokenizer.ggml.add_space_prefix"); ok {
		t.addSpacePrefix = v && t.kind == kindSPM
	}

	// Defaults that point outside the vocabulary are dropped. Explicit ids
	// out of range are ignored, keeping the default, as llama.cpp does (some
	// converters write 0xFFFFFFFF to mean "none").
	for _, id := range []*int32{&t.bos, &t.eos, &t.unk} {
		if *id >= int32(n) {
			*id = -1
		}
	}
	for key, dst := range map[string]*int32{
		"tokenizer.ggml.bos_token_id":     &t.bos,
		"tokenizer.ggml.eos_token_id":     &t.eos,
		"tokenizer.ggml.eot_token_id":     &t.eot,
		"tokenizer.ggml.eom_token_id":     &t.eom,
		"tokenizer.ggml.unknown_token_id": &t.unk,
	} {
		if v, ok := f.Uint(key); ok && v < uint64(n) {
			*dst = int32(v)
		}
	}
	if v, ok := f.Bool("tokenizer.ggml.add_bos_token"); ok {
		t.addBOS = v
	}
	if v, ok := f.Bool("tokenizer.ggml.add_eos_token"); ok {
		t.addEOS = v
	}
	if t.addBOS && t.bos < 0 {
		return nil, errors.New("tokenizer: add_bos_token is set but there is no BOS token")
	}
	if t.addEOS && t.eos < 0 {
		return nil, errors.New("tokenizer: add_eos_token is set but there is no EOS token")
	}

	t.findEOG()
	t.buildByteTokens()
	t.buildPieces()
	t.indexSpecial()
	return t, nil
}

// indexSpecial lists the tokens matched whole in text before any
// splitting (control, user-defined, unknown), longest first.
func (t *Tokenizer) indexSpecial() {
	t.special = t.special[:0]
	t.controlByFirst = [256][]int32{}
	for i := range t.tokens {
		switch t.types[i] {
		case typeControl, typeUserDefined, typeUnknown:
			t.special = append(t.special, int32(i))
		}
		if ty := t.types[i]; (ty == typeControl || ty == typeUnknown) && t.tokens[i] != "" && !strings.Contains(t.tokens[i], specialMark) {
			b := t.tokens[i][0]
			t.controlByFirst[b] = append(t.controlByFirst[b], int32(i))
		}
	}
	slices.SortStableFunc(t.special, func(a, b int32) int {
		return len(t.tokens[b]) - len(t.tokens[a])
	})
}

// eogTexts are tokens that end a turn in common chat formats even when the
// GGUF names a different EOS; llama.cpp recognises them by text the same way.
var eogTexts = []string{
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
}

var eotTexts = []string{
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|end_of_text|>", "<EOT>", "_<EOT>", "<end_of_utterance>",
}

func (t *Tokenizer) findEOG() {
	// Such tokens must be control tokens so that they are never rendered;
	// some converters mark them as normal.
	markControl := func(id int32) { t.types[id] = typeControl }
	if t.eot < 0 {
		for _, s := range eotTexts {
			if id, ok := t.toID[s]; ok {
				t.eot = id
				markControl(id)
				break
			}
		}
	}
	if t.eom < 0 {
		if id, ok := t.toID["<|eom_id|>"]; ok {
			t.eom = id
			markControl(id)
		}
	}
	for _, s := range eogTexts {
		if id, ok := t.toID[s]; ok {
			t.eog[id] = true
			markControl(id)
		}
	}
	for _, id := range []int32{t.eos, t.eot, t.eom} {
		if id >= 0 {
			t.eog[id] = true
		}
	}
	// gpt-oss ends every message with <|end|> but stops generating only at
	// <|return|> or <|call|>; <|end|> must then render and not stop.
	_, hasReturn := t.toID["<|return|>"]
	_, hasCall := t.toID["<|call|>"]
	if end, ok := t.toID["<|end|>"]; ok && hasReturn && hasCall {
		delete(t.eog, end)
		t.types[end] = typeUserDefined
		for _, s := range []string{"<|return|>", "<|call|>"} {
			t.eog[t.toID[s]] = true
		}
	}
}

func (t *Tokenizer) buildByteTokens() {
	for b := range 256 {
		t.byteTok[b] = -1
		if t.kind == kindSPM {
			if id, ok := t.toID[fmt.Sprintf("<0x%02X>", b)]; ok {
				t.byteTok[b] = id
				continue
			}
			if id, ok := t.toID[string([]byte{byte(b)})]; ok {
				t.byteTok[b] = id
			}
		} else {
			if id, ok := t.toID[byteEncode[b]]; ok {
				t.byteTok[b] = id
			}
		}
	}
}

func (t *Tokenizer) buildPieces() {
	t.pieces = make([]string, len(t.tokens))
	for i, s := range t.tokens {
		switch t.types[i] {
		case typeControl, typeUnknown, typeUserDefined:
			t.pieces[i] = s
		case typeNormal:
			if t.kind == kindSPM {
				t.pieces[i] = strings.ReplaceAll(s, "▁", " ")
			} else {
				t.pieces[i] = byteDecode(s)
			}
		case typeByte:
			if b, ok := parseByteToken(s); ok {
				t.pieces[i] = string([]byte{b})
			} else {
				t.pieces[i] = s
			}
		default:
			// Unused and undefined tokens render as nothing, as in llama.cpp.
		}
	}
}

func parseByteToken(s string) (byte, bool) {
	if len(s) != 6 || !strings.HasPrefix(s, "<0x") || s[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(s[3:5], 16, 8)
	return byte(v), err == nil
}

// VocabSize is the number of tokens in the vocabulary.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// BOS is the beginning-of-sequence token, or -1 if the vocabulary has none.
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOS is the end-of-sequence token, or -1 if the vocabulary has none.
func (t *Tokenizer) EOS() int32 { return t.eos }

// EOT is the end-of-turn token, or -1 if the vocabulary has none.
func (t *Tokenizer) EOT() int32 { return t.eot }

// AddBOS reports whether Encode with addSpecial prepends BOS.
func (t *Tokenizer) AddBOS() bool { return t.addBOS }

// AddEOS reports whether Encode with addSpecial appends EOS.
func (t *Tokenizer) AddEOS() bool { return t.addEOS }

// IsEOG reports whether generation should stop at id: EOS, EOT, EOM and the
// turn-ending tokens of common chat formats.
func (t *Tokenizer) IsEOG(id int32) bool { return t.eog[id] }

// IsControl reports whether id is a control or unknown token, the kinds
// Decode leaves out.
func (t *Tokenizer) IsControl(id int32) bool {
	if id < 0 || int(id) >= len(t.types) {
		return false
	}
	ty := t.types[id]
	return ty == typeControl || ty == typeUnknown
}

// ChatTemplate is the Jinja chat template stored in the GGUF, or "".
func (t *Tokenizer) ChatTemplate() string { return t.chatTemplate }

// Model is the vocabulary kind in llama.cpp's words (tokenizer.ggml.model):
// "llama" for SentencePiece-style BPE, "gpt2" for byte-level BPE.
func (t *Tokenizer) Model() string { return t.model }

// TokenText is the text one token stands for, with control tokens shown
// literally (for logprobs). A byte-fallback token yields its single raw
// byte, which on its own may not be valid UTF-8. Out-of-range ids give "".
func (t *Tokenizer) TokenText(id int32) string {
	if id < 0 || int(id) >= len(t.pieces) {
		return ""
	}
	return t.pieces[id]
}

// TokenID looks up the id of a token by its exact vocabulary text.
func (t *Tokenizer) TokenID(text string) (int32, bool) {
	id, ok := t.toID[text]
	return id, ok
}

// Encode tokenizes text. addSpecial adds BOS and/or EOS as the model asks
// (AddBOS, AddEOS). parseSpecial lets control tokens written in the text,
// such as "<|im_start|>", become their token instead of being spelled out;
// user-defined tokens are always matched, as llama.cpp does.
func (t *Tokenizer) Encode(text string, addSpecial, parseSpecial bool) []int32 {
	return t.encode(text, addSpecial, parseSpecial, false)
}

// encode is Encode; escaped says text was built with EscapeSpecial's
// marks (see EncodeEscaped).
func (t *Tokenizer) encode(text string, addSpecial, parseSpecial, escaped bool) []int32 {
	out := make([]int32, 0, len(text)/3+2)
	if addSpecial && t.addBOS {
		out = append(out, t.bos)
	}
	frags := t.partition(text, parseSpecial, escaped)
	// span is a text fragment's text, its marks taken out when escaped; a
	// fragment of nothing but marks is no text at all.
	span := func(fr fragment) string {
		if escaped {
			return unescape(text[fr.start:fr.end])
		}
		return text[fr.start:fr.end]
	}
	switch {
	case t.hf != nil:
		for _, fr := range frags {
			if fr.tok >= 0 {
				out = append(out, fr.tok)
				continue
			}
			raw := span(fr)
			if raw == "" {
				continue
			}
			s := t.hf.normalize(raw, fr.start == 0)
			if t.kind == kindBPE {
				out = t.encodeBPE(s, out)
				continue
			}
			for _, w := range t.hf.words(s) {
				out = t.encodeSPM(w, out)
			}
		}
	case t.kind == kindSPM:
		var sb strings.Builder
		prevSpecial := true
		for _, fr := range frags {
			if fr.tok >= 0 {
				out = append(out, fr.tok)
				prevSpecial = true
				continue
			}
			raw := span(fr)
			if raw == "" {
				continue
			}
			sb.Reset()
			if t.addSpacePrefix && prevSpecial {
				sb.WriteString("▁")
			}
			for _, c := range []byte(raw) {
				if c == ' ' {
					sb.WriteString("▁")
				} else {
					sb.WriteByte(c)
				}
			}
			out = t.encodeSPM(sb.String(), out)
			prevSpecial = false
		}
	case t.kind == kindBPE:
		for _, fr := range frags {
			if fr.tok >= 0 {
				out = append(out, fr.tok)
				continue
			}
			if raw := span(fr); raw != "" {
				out = t.encodeBPE(raw, out)
			}
		}
	}
	if addSpecial && t.addEOS {
		out = append(out, t.eos)
	}
	return out
}

// fragment is either a special token (tok >= 0) or a span of raw text.
type fragment struct {
	tok        int32
	start, end int
}

// partition splits text around literal occurrences of special tokens.
// With escaped, a control token that EscapeSpecial marked is left in the
// text.
func (t *Tokenizer) partition(text string, parseSpecial, escaped bool) []fragment {
	if text == "" {
		return nil
	}
	frags := []fragment{{tok: -1, start: 0, end: len(text)}}
	for _, id := range t.special {
		ty := t.types[id]
		control := ty == typeControl || ty == typeUnknown
		if !parseSpecial && control {
			continue
		}
		s := t.tokens[id]
		if !strings.Contains(text, s) {
			continue
		}
		var next []fragment
		for _, fr := range frags {
			if fr.tok >= 0 {
				next = append(next, fr)
				continue
			}
			start, from := fr.start, fr.start
			for from < fr.end {
				i := strings.Index(text[from:fr.end], s)
				if i < 0 {
					break
				}
				at := from + i
				if escaped && control && marked(text, at) {
					from = at + 1
					continue
				}
				if at > start {
					next = append(next, fragment{tok: -1, start: start, end: at})
				}
				next = append(next, fragment{tok: id})
				start = at + len(s)
				from = start
			}
			if start < fr.end {
				next = append(next, fragment{tok: -1, start: start, end: fr.end})
			}
		}
		frags = next
	}
	return frags
}

// Decode renders tokens as text the way a client should see generated
// output: control and unknown tokens are left out, nothing is trimmed (a
// continuation keeps its leading space), and byte sequences that are not
// valid UTF-8 become U+FFFD, one per byte. It equals the concatenation of
// a StreamDecoder's outputs for the same tokens.
func (t *Tokenizer) Decode(ids []int32) string {
	d := t.NewStreamDecoder()
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteString(d.Push(id))
	}
	sb.WriteString(d.Flush())
	return sb.String()
}

// Detokenize mirrors llama.cpp's llama_detokenize, for turning a whole
// encoded prompt back into its text. removeSpecial drops a leading BOS and
// a trailing EOS when the model adds them; unparseSpecial renders control
// tokens literally instead of leaving them out. For SentencePiece
// vocabularies the space that encoding prepended is removed from the first
// token, except when a BOS was dropped (llama.cpp keeps it then); for GPT-2
// style vocabularies clean_up_tokenization_spaces is applied where llama.cpp
// applies it. The result is raw bytes and need not be valid UTF-8.
func (t *Tokenizer) Detokenize(ids []int32, removeSpecial, unparseSpecial bool) string {
	removeSpace := t.addSpacePrefix
	if removeSpecial && t.addBOS && len(ids) > 0 && ids[0] == t.bos {
		removeSpace = false
		ids = ids[1:]
	}
	if removeSpecial && t.addEOS && len(ids) > 0 && ids[len(ids)-1] == t.eos {
		ids = ids[:len(ids)-1]
	}
	var b []byte
	for _, id := range ids {
		if id < 0 || int(id) >= len(t.pieces) {
			continue
		}
		p := t.pieces[id]
		if !unparseSpecial && t.IsControl(id) {
			p = ""
		}
		if removeSpace {
			p = strings.TrimPrefix(p, " ")
			removeSpace = false
		}
		b = append(b, p...)
	}
	if t.cleanSpaces {
		b = cleanUpSpaces(b)
	}
	return string(b)
}

// cleanUpSpaces undoes the spaces GPT-2 style tokenizers put before
// punctuation and some English contractions, as HF's
// clean_up_tokenization_spaces and llama.cpp do.
func cleanUpSpaces(b []byte) []byte {
	if len(b) == 0 {
		return b
	}
	// " ?", " !", " .", " ," lose the space.
	out := make([]byte, 1, len(b))
	out[0] = b[0]
	for i := 1; i < len(b); i++ {
		x := b[i]
		if b[i-1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',') {
			out = out[:len(out)-1]
		}
		out = append(out, x)
	}
	b = out
	// " ' " becomes "'"; the swallowed space no longer counts as a space
	// for the next character, as in llama.cpp's in-place version.
	out = make([]byte, 1, len(b))
	out[0] = b[0]
	prev := b[0]
	for i := 1; i < len(b); i++ {
		x := b[i]
		if x == '\'' && i+1 < len(b) && prev == ' ' && b[i+1] == ' ' {
			out = out[:len(out)-1]
			out = append(out, x)
			i++
			prev = 0
			continue
		}
		out = append(out, x)
		prev = x
	}
	b = out
	// " 's", " 'm", " 're", " 've" lose the space.
	out = make([]byte, 1, len(b))
	out[0] = b[0]
	for i := 1; i < len(b); i++ {
		x := b[i]
		if b[i-1] == ' ' && x == '\'' && i+1 < len(b) {
			x1 := b[i+1]
			if x1 == 's' || x1 == 'm' {
				out = out[:len(out)-1]
			} else if i+2 < len(b) && x1 != 't' && x1 != 'd' {
				x2 := b[i+2]
				if (x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e') {
					out = out[:len(out)-1]
				}
			}
		}
		out = append(out, x)
	}
	return out
}
