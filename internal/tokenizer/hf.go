package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// Hugging Face tokenizers: tokenizer.json (the tokenizers library's
// format), tokenizer_config.json and special_tokens_map.json (transformers'
// settings: BOS/EOS, add_bos_token, the chat template) and
// generation_config.json (extra end-of-generation ids).
//
// Supported are BPE models of the two kinds baton already runs:
//
//   - byte-level BPE (GPT-2, Llama 3, Qwen2/3): a ByteLevel pre-tokenizer,
//     optionally after Split regexes and Digits, and an NFC/NFKC normalizer;
//   - SentencePiece-style BPE (Llama 2, Mistral): a normalizer that
//     prepends "▁" and replaces spaces by it, or a Metaspace pre-tokenizer,
//     with byte fallback.
//
// Merges are applied by rank, as the tokenizers library does. Added tokens
// marked special become control tokens, matched in text only when Encode
// is asked to parse special tokens; other added tokens are matched always.
// Their lstrip/rstrip/single_word flags are not applied.

// hfFiles holds the raw contents of a model directory's tokenizer files;
// only Tokenizer is required.
type hfFiles struct {
	Tokenizer, Config, SpecialTokensMap, GenerationConfig, ModelConfig []byte
	// ChatTemplate is chat_template.jinja (or chat_template.json) when
	// tokenizer_config.json has no template.
	ChatTemplate, ChatTemplateJSON []byte
}

// FromHFDir builds a tokenizer from a Hugging Face model directory:
// tokenizer.json, with tokenizer_config.json, special_tokens_map.json,
// generation_config.json (its eos_token_id ends generation too) and a
// separate chat_template.jinja when present.
func FromHFDir(dir string) (*Tokenizer, error) {
	read := func(name string, required bool) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil && (required || !errors.Is(err, os.ErrNotExist)) {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		return b, nil
	}
	var files hfFiles
	var err error
	for _, f := range []struct {
		name     string
		dst      *[]byte
		required bool
	}{
		{"tokenizer.json", &files.Tokenizer, true},
		{"tokenizer_config.json", &files.Config, false},
		{"special_tokens_map.json", &files.SpecialTokensMap, false},
		{"generation_config.json", &files.GenerationConfig, false},
		{"config.json", &files.ModelConfig, false},
		{"chat_template.jinja", &files.ChatTemplate, false},
		{"chat_template.json", &files.ChatTemplateJSON, false},
	} {
		if *f.dst, err = read(f.name, f.required); err != nil {
			return nil, err
		}
	}
	t, err := fromHF(files)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, dir)
	}
	return t, nil
}

// hfNode is any tokenizer.json pipeline component; which fields mean
// something depends on Type.
type hfNode struct {
	Type          string            `json:"type"`
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`
	Prepend       string            `json:"prepend"`
	Pattern       struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Content          string            `json:"content"`
	Behavior         string            `json:"behavior"`
	Invert           bool              `json:"invert"`
	AddPrefixSpace   *bool             `json:"add_prefix_space"`
	UseRegex         *bool             `json:"use_regex"`
	Replacement      string            `json:"replacement"`
	PrependScheme    string            `json:"prepend_scheme"`
	Split            *bool             `json:"split"`
	IndividualDigits bool              `json:"individual_digits"`
	Single           []json.RawMessage `json:"single"`
	SpecialTokens    map[string]struct {
		IDs []int64 `json:"ids"`
	} `json:"special_tokens"`
}

type hfAddedToken struct {
	ID         int64  `json:"id"`
	Content    string `json:"content"`
	Special    bool   `json:"special"`
	Normalized bool   `json:"normalized"`
}

type hfTokenizerJSON struct {
	AddedTokens   []hfAddedToken  `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         hfModelJSON     `json:"model"`
}

// hfModelJSON is tokenizer.json's model: the BPE vocabulary and merges.
type hfModelJSON struct {
	Type                    string            `json:"type"`
	Vocab                   json.RawMessage   `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	ByteFallback            bool              `json:"byte_fallback"`
	FuseUnk                 bool              `json:"fuse_unk"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
}

// hfText is what HF does to each run of text between added tokens before
// BPE: normalizers, then (for SentencePiece-style vocabularies) Metaspace.
type hfText struct {
	normalizers []func(string) string
	// Metaspace pre-tokenizer: replace spaces by replacement, prepend it
	// per scheme (always, first, never), and split before each one.
	metaspace   bool
	replacement string
	scheme      string
	msSplit     bool
	// prefixSpace is ByteLevel's add_prefix_space.
	prefixSpace bool
	// byteFallback false: characters outside the vocabulary become the
	// unknown token, one per character (fused when fuseUnk).
	byteFallback, fuseUnk bool
	// shrink is the most the normalizers can divide a text's byte length
	// by (see MaxTokenBytes); 0 when they can delete text outright.
	shrink int
}

// normalize prepares one text run; first says the run starts the input.
func (h *hfText) normalize(s string, first bool) string {
	for _, f := range h.normalizers {
		s = f(s)
	}
	if h.metaspace {
		s = strings.ReplaceAll(s, " ", h.replacement)
		if s != "" && (h.scheme == "always" || (h.scheme == "first" && first)) && !strings.HasPrefix(s, h.replacement) {
			s = h.replacement + s
		}
	}
	if h.prefixSpace && s != "" && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	return s
}

// words splits a normalized run for Metaspace with split on: each word
// starts at a replacement character.
func (h *hfText) words(s string) []string {
	if !h.metaspace || !h.msSplit || h.replacement == "" {
		return []string{s}
	}
	var out []string
	for s != "" {
		i := strings.Index(s[1:], h.replacement)
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

const (
	maxHFVocab    = 1 << 24 // no vocabulary comes close
	maxRegexLen   = 4096
	regexDeadline = 2 * time.Second
)

// contractionsHF is the case-insensitive contraction group the GPT-4 style
// split regexes of Llama 3 and Qwen start with; it is replaced by the same
// spelled-out form llama.cpp uses.
const contractionsHF = `(?i:'s|'t|'re|'ve|'m|'ll|'d)`

func compileSplit(expr string) (*regexp2.Regexp, error) {
	if len(expr) > maxRegexLen {
		return nil, fmt.Errorf("tokenizer: split regex of %d bytes is too long", len(expr))
	}
	expr = strings.ReplaceAll(expr, contractionsHF, contractionsCI)
	re, err := regexp2.Compile(expr, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: split regex %q: %w", expr, err)
	}
	re.MatchTimeout = regexDeadline
	return re, nil
}

var byteTokenRE = regexp.MustCompile(`^<0x[0-9A-F]{2}>$`)

// nodes decodes a component and, for Sequence components, its children,
// depth first, in order.
func nodes(raw json.RawMessage, depth int) ([]hfNode, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if depth > 8 {
		return nil, errors.New("tokenizer: tokenizer.json nests Sequences too deeply")
	}
	var n hfNode
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json: %w", err)
	}
	if n.Type != "Sequence" {
		return []hfNode{n}, nil
	}
	var out []hfNode
	for _, list := range [][]json.RawMessage{n.Normalizers, n.Pretokenizers, n.Processors, n.Decoders} {
		for _, c := range list {
			sub, err := nodes(c, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
		}
	}
	return out, nil
}

// specialText reads a transformers special-token setting: a string, an
// AddedToken object {"content": ...}, or null.
func specialText(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var o struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Content != nil {
		return *o.Content, true
	}
	return "", false
}

// tokenIDs reads an id field that is an integer, a list of them, or null.
func tokenIDs(raw json.RawMessage) []int64 {
	if len(raw) == 0 {
		return nil
	}
	var one int64
	if json.Unmarshal(raw, &one) == nil {
		return []int64{one}
	}
	var many []int64
	_ = json.Unmarshal(raw, &many)
	return many
}

type hfConfigJSON struct {
	AddBOS       *bool           `json:"add_bos_token"`
	AddEOS       *bool           `json:"add_eos_token"`
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	Unk          json.RawMessage `json:"unk_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
	CleanSpaces  *bool           `json:"clean_up_tokenization_spaces"`
	AddedDecoder map[string]struct {
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens_decoder"`
}

// chatTemplateFrom reads chat_template: a string, or a list of
// {name, template} of which "default" is taken.
func chatTemplateFrom(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", errors.New("tokenizer: chat_template is neither a string nor a list of {name, template}")
	}
	for _, e := range list {
		if e.Name == "default" {
			return e.Template, nil
		}
	}
	return "", nil
}

// fromHF builds a tokenizer from the files of a Hugging Face directory.
func fromHF(files hfFiles) (*Tokenizer, error) {
	var tj hfTokenizerJSON
	if err := json.Unmarshal(files.Tokenizer, &tj); err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json: %w", err)
	}
	var cfg hfConfigJSON
	if len(files.Config) > 0 {
		if err := json.Unmarshal(files.Config, &cfg); err != nil {
			return nil, fmt.Errorf("tokenizer: tokenizer_config.json: %w", err)
		}
	}
	var stm hfConfigJSON
	if len(files.SpecialTokensMap) > 0 {
		if err := json.Unmarshal(files.SpecialTokensMap, &stm); err != nil {
			return nil, fmt.Errorf("tokenizer: special_tokens_map.json: %w", err)
		}
	}
	m := &tj.Model
	if m.Type != "BPE" && !(m.Type == "" && m.Merges != nil) {
		return nil, fmt.Errorf("tokenizer: tokenizer.json model type %q is not supported (BPE is)", m.Type)
	}
	if (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") || (m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return nil, errors.New("tokenizer: BPE with continuing_subword_prefix or end_of_word_suffix is not supported")
	}
	// The stages, in the order tokenizer.json describes its pipeline.
	t, err := hfVocabulary(&tj)
	if err != nil {
		return nil, err
	}
	h := &hfText{byteFallback: m.ByteFallback, fuseUnk: m.FuseUnk, shrink: 1}
	if err := hfNormalizers(t, h, tj.Normalizer); err != nil {
		return nil, err
	}
	if err := hfPreTokenizers(t, h, tj.PreTokenizer); err != nil {
		return nil, err
	}
	t.hf = h
	t.ignoreMerges = m.IgnoreMerges
	if err := hfMerges(t, m.Merges); err != nil {
		return nil, err
	}
	hfSpecials(t, m, &cfg, &stm)
	if err := hfPostProcessor(t, tj.PostProcessor, &cfg); err != nil {
		return nil, err
	}
	t.cleanSpaces = cfg.CleanSpaces != nil && *cfg.CleanSpaces && t.kind == kindBPE
	if err := hfChatTemplate(t, &cfg, files); err != nil {
		return nil, err
	}
	t.findEOG()
	hfGenerationEOS(t, files)
	t.buildByteTokens()
	if t.kind == kindSPM && !m.ByteFallback {
		for b := range t.byteTok {
			t.byteTok[b] = -1
		}
	}
	t.buildPieces()
	t.indexSpecial()
	return t, nil
}

// hfVocabulary lays out the vocabulary and the added tokens by id; ids
// may leave gaps, filled with unused entries that never match.
func hfVocabulary(tj *hfTokenizerJSON) (*Tokenizer, error) {
	m := &tj.Model
	var vocab map[string]int64
	if err := json.Unmarshal(m.Vocab, &vocab); err != nil || len(vocab) == 0 {
		return nil, fmt.Errorf("tokenizer: tokenizer.json model.vocab must be a non-empty map of token to id (%v)", err)
	}
	maxID := int64(-1)
	check := func(id int64, what string) error {
		if id < 0 || id >= maxHFVocab || id >= int64(len(vocab)+len(tj.AddedTokens))+65536 {
			return fmt.Errorf("tokenizer: %s has implausible id %d", what, id)
		}
		maxID = max(maxID, id)
		return nil
	}
	for s, id := range vocab {
		if err := check(id, fmt.Sprintf("token %q", s)); err != nil {
			return nil, err
		}
	}
	for _, a := range tj.AddedTokens {
		if err := check(a.ID, fmt.Sprintf("added token %q", a.Content)); err != nil {
			return nil, err
		}
		if a.Content == "" {
			return nil, fmt.Errorf("tokenizer: added token %d is empty", a.ID)
		}
	}
	n := int(maxID + 1)
	t := &Tokenizer{
		model:  "llama",
		source: "tokenizer.json",
		tokens: make([]string, n),
		scores: make([]float32, n),
		types:  make([]int32, n),
		toID:   make(map[string]int32, n),
		bos:    -1, eos: -1, eot: -1, eom: -1, unk: -1,
		eog: map[int32]bool{},
	}
	for i := range t.types {
		t.types[i] = typeUnused
	}
	for s, id := range vocab {
		if t.types[id] != typeUnused {
			return nil, fmt.Errorf("tokenizer: id %d is given to both %q and %q", id, t.tokens[id], s)
		}
		t.tokens[id], t.types[id] = s, typeNormal
		t.toID[s] = int32(id)
	}
	for _, a := range tj.AddedTokens {
		if t.types[a.ID] == typeNormal && t.tokens[a.ID] != a.Content {
			return nil, fmt.Errorf("tokenizer: added token %q has the id %d of %q", a.Content, a.ID, t.tokens[a.ID])
		}
		t.tokens[a.ID] = a.Content
		t.toID[a.Content] = int32(a.ID)
		if a.Special {
			t.types[a.ID] = typeControl
		} else {
			t.types[a.ID] = typeUserDefined
		}
	}
	return t, nil
}

// hfNormalizers turns tokenizer.json's normalizers into h's, with what
// each does to the bound on bytes per token (shrink).
func hfNormalizers(t *Tokenizer, h *hfText, raw json.RawMessage) error {
	norms, err := nodes(raw, 0)
	if err != nil {
		return err
	}
	for _, nd := range norms {
		switch nd.Type {
		case "NFC":
			h.normalizers = append(h.normalizers, norm.NFC.String)
			h.shrink *= nfShrink
		case "NFKC":
			h.normalizers = append(h.normalizers, norm.NFKC.String)
			h.shrink *= nfkShrink
		case "NFD":
			h.normalizers = append(h.normalizers, norm.NFD.String)
			h.shrink *= nfShrink
		case "NFKD":
			h.normalizers = append(h.normalizers, norm.NFKD.String)
			h.shrink *= nfkShrink
		case "Lowercase":
			h.shrink *= lowerShrink
			h.normalizers = append(h.normalizers, strings.ToLower)
		case "Prepend":
			p := nd.Prepend
			h.normalizers = append(h.normalizers, func(s string) string {
				if s == "" {
					return s
				}
				return p + s
			})
			t.addSpacePrefix = true
		case "Replace":
			if nd.Pattern.String == nil {
				return errors.New("tokenizer: only string patterns are supported in a Replace normalizer")
			}
			from, to := *nd.Pattern.String, nd.Content
			if from == "" {
				return errors.New("tokenizer: Replace normalizer with an empty pattern")
			}
			h.normalizers = append(h.normalizers, func(s string) string { return strings.ReplaceAll(s, from, to) })
			if to == "" {
				h.shrink = 0
			} else {
				h.shrink *= (len(from) + len(to) - 1) / len(to)
			}
		default:
			return fmt.Errorf("tokenizer: normalizer %q is not supported", nd.Type)
		}
	}
	return nil
}

// hfPreTokenizers picks the pipeline, byte-level or SentencePiece-style,
// from tokenizer.json's pre-tokenizers.
func hfPreTokenizers(t *Tokenizer, h *hfText, raw json.RawMessage) error {
	pres, err := nodes(raw, 0)
	if err != nil {
		return err
	}
	byteLevel := false
	pre := &preTokenizer{}
	for _, nd := range pres {
		switch nd.Type {
		case "ByteLevel":
			byteLevel = true
			if nd.UseRegex == nil || *nd.UseRegex {
				re, err := compileSplit(gpt2Regex)
				if err != nil {
					return err
				}
				pre.res = append(pre.res, re)
			}
			h.prefixSpace = nd.AddPrefixSpace != nil && *nd.AddPrefixSpace
		case "Split":
			if nd.Behavior != "Isolated" || nd.Invert {
				return fmt.Errorf("tokenizer: Split pre-tokenizer with behavior %q (invert %v) is not supported (Isolated is)", nd.Behavior, nd.Invert)
			}
			var expr string
			switch {
			case nd.Pattern.Regex != nil:
				expr = *nd.Pattern.Regex
			case nd.Pattern.String != nil && *nd.Pattern.String != "":
				expr = regexp2.Escape(*nd.Pattern.String)
			default:
				return errors.New("tokenizer: Split pre-tokenizer without a pattern")
			}
			re, err := compileSplit(expr)
			if err != nil {
				return err
			}
			pre.res = append(pre.res, re)
		case "Digits":
			expr := `\p{N}+`
			if nd.IndividualDigits {
				expr = `\p{N}`
			}
			re, _ := compileSplit(expr)
			pre.res = append(pre.res, re)
		case "Metaspace":
			h.metaspace = true
			h.replacement = nd.Replacement
			if h.replacement == "" {
				h.replacement = "▁"
			}
			h.scheme = nd.PrependScheme
			if h.scheme == "" {
				h.scheme = "always"
				if nd.AddPrefixSpace != nil && !*nd.AddPrefixSpace {
					h.scheme = "never"
				}
			}
			h.msSplit = nd.Split == nil || *nd.Split
			t.addSpacePrefix = h.scheme != "never"
		default:
			return fmt.Errorf("tokenizer: pre-tokenizer %q is not supported", nd.Type)
		}
	}
	if byteLevel {
		if h.metaspace {
			return errors.New("tokenizer: ByteLevel and Metaspace pre-tokenizers together are not supported")
		}
		t.kind, t.model = kindBPE, "gpt2"
		t.pre = pre
	} else {
		if len(pre.res) > 0 {
			return errors.New("tokenizer: split regexes without a ByteLevel pre-tokenizer are not supported")
		}
		t.kind = kindSPM
	}
	return nil
}

// hfMerges reads the merges by rank: "a b" strings or ["a", "b"] pairs.
func hfMerges(t *Tokenizer, merges []json.RawMessage) error {
	t.merges = make(map[mergeKey]int32, len(merges))
	for i, raw := range merges {
		var k mergeKey
		var s string
		var pair []string
		switch {
		case json.Unmarshal(raw, &s) == nil:
			l, r, ok := strings.Cut(s, " ")
			if !ok {
				return fmt.Errorf("tokenizer: merge %d %q is not two tokens", i, s)
			}
			k = mergeKey{l, r}
		case json.Unmarshal(raw, &pair) == nil && len(pair) == 2:
			k = mergeKey{pair[0], pair[1]}
		default:
			return fmt.Errorf("tokenizer: merge %d is neither \"a b\" nor [a, b]: %s", i, raw)
		}
		if _, ok := t.toID[k.left+k.right]; !ok {
			return fmt.Errorf("tokenizer: merge %d (%q, %q) makes %q, which is not in the vocabulary", i, k.left, k.right, k.left+k.right)
		}
		if _, dup := t.merges[k]; !dup {
			t.merges[k] = int32(i)
		}
	}
	return nil
}

// hfSpecials marks byte tokens (SentencePiece byte fallback) and the
// unknown token, and finds BOS and EOS by their text in
// tokenizer_config.json, then special_tokens_map.json.
func hfSpecials(t *Tokenizer, m *hfModelJSON, cfg, stm *hfConfigJSON) {
	if m.ByteFallback {
		for i, s := range t.tokens {
			if t.types[i] == typeNormal && byteTokenRE.MatchString(s) {
				t.types[i] = typeByte
			}
		}
	}
	if m.UnkToken != nil {
		if id, ok := t.toID[*m.UnkToken]; ok {
			t.unk = id
			t.types[id] = typeUnknown
		}
	}

	lookup := func(field func(*hfConfigJSON) json.RawMessage) int32 {
		for _, c := range []*hfConfigJSON{cfg, stm} {
			if s, ok := specialText(field(c)); ok {
				if id, ok := t.toID[s]; ok {
					return id
				}
			}
		}
		return -1
	}
	t.bos = lookup(func(c *hfConfigJSON) json.RawMessage { return c.BOS })
	t.eos = lookup(func(c *hfConfigJSON) json.RawMessage { return c.EOS })
	if id := lookup(func(c *hfConfigJSON) json.RawMessage { return c.Unk }); id >= 0 {
		t.unk = id
		t.types[id] = typeUnknown
	}
}

// hfPostProcessor decides the BOS/EOS Encode adds: add_bos_token and
// add_eos_token when given, else what the TemplateProcessing
// post-processor puts around $A.
func hfPostProcessor(t *Tokenizer, raw json.RawMessage, cfg *hfConfigJSON) error {
	n := len(t.tokens)
	posts, err := nodes(raw, 0)
	if err != nil {
		return err
	}
	for _, nd := range posts {
		if nd.Type != "TemplateProcessing" || len(nd.Single) == 0 {
			continue
		}
		special := func(raw json.RawMessage) (int32, bool) {
			var piece struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
			}
			if json.Unmarshal(raw, &piece) != nil || piece.SpecialToken == nil {
				return -1, false
			}
			name := piece.SpecialToken.ID
			if st, ok := nd.SpecialTokens[name]; ok && len(st.IDs) == 1 && st.IDs[0] >= 0 && st.IDs[0] < int64(n) {
				return int32(st.IDs[0]), true
			}
			id, ok := t.toID[name]
			return id, ok
		}
		if id, ok := special(nd.Single[0]); ok {
			t.addBOS = true
			if t.bos < 0 {
				t.bos = id
			}
		}
		if id, ok := special(nd.Single[len(nd.Single)-1]); ok && len(nd.Single) > 1 {
			t.addEOS = true
			if t.eos < 0 {
				t.eos = id
			}
		}
	}
	if cfg.AddBOS != nil {
		t.addBOS = *cfg.AddBOS
	}
	if cfg.AddEOS != nil {
		t.addEOS = *cfg.AddEOS
	}
	if t.addBOS && t.bos < 0 {
		return errors.New("tokenizer: BOS is to be added but there is no BOS token")
	}
	if t.addEOS && t.eos < 0 {
		return errors.New("tokenizer: EOS is to be added but there is no EOS token")
	}
	return nil
}

// hfChatTemplate takes the chat template from tokenizer_config.json, else
// chat_template.jinja, else chat_template.json.
func hfChatTemplate(t *Tokenizer, cfg *hfConfigJSON, files hfFiles) error {
	var err error
	if t.chatTemplate, err = chatTemplateFrom(cfg.ChatTemplate); err != nil {
		return err
	}
	if t.chatTemplate == "" && len(files.ChatTemplate) > 0 {
		t.chatTemplate = string(files.ChatTemplate)
	}
	if t.chatTemplate == "" && len(files.ChatTemplateJSON) > 0 {
		var ct struct {
			ChatTemplate json.RawMessage `json:"chat_template"`
		}
		if json.Unmarshal(files.ChatTemplateJSON, &ct) == nil {
			t.chatTemplate, _ = chatTemplateFrom(ct.ChatTemplate)
		}
	}
	return nil
}

// hfGenerationEOS adds generation_config.json's eos_token_id (else
// config.json's) to what ends generation: Qwen and Llama 3 instruct models
// list several.
func hfGenerationEOS(t *Tokenizer, files hfFiles) {
	for _, b := range [][]byte{files.GenerationConfig, files.ModelConfig} {
		if len(b) == 0 {
			continue
		}
		var g struct {
			EOS json.RawMessage `json:"eos_token_id"`
		}
		if json.Unmarshal(b, &g) != nil {
			continue
		}
		ids := tokenIDs(g.EOS)
		for _, id := range ids {
			if id >= 0 && id < int64(len(t.tokens)) {
				t.eog[int32(id)] = true
			}
		}
		if len(ids) > 0 {
			break
		}
	}
}

// AddEOG makes ids end generation too (say, a model's
// generation_config.json eos_token_id). Ids outside the vocabulary are
// ignored. Call it before the tokenizer is shared: it is the one method
// that changes a Tokenizer.
func (t *Tokenizer) AddEOG(ids ...int32) {
	for _, id := range ids {
		if id >= 0 && int(id) < len(t.tokens) {
			t.eog[id] = true
		}
	}
}

// EOGs lists the ids that end generation, in increasing order.
func (t *Tokenizer) EOGs() []int32 {
	out := make([]int32, 0, len(t.eog))
	for id := range t.eog {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Source says what the tokenizer was built from: "gguf" or "tokenizer.json".
func (t *Tokenizer) Source() string { return t.source }
