// Package inspect describes a model path the way baton would load it —
// weights, shape, dtypes, tokenizer, special tokens and chat template —
// for `baton model inspect`. It joins model and tokenizer, which do not
// import each other.
package inspect

import (
	"fmt"
	"strings"

	"github.com/batonlm/baton/internal/bundled"
	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/tokenizer"
)

// Inspect returns a human-readable description of the model at path: a
// GGUF file, a Hugging Face directory (or its config.json), or "" for the
// bundled model. Problems the loader would refuse are reported in the
// text; the error is for paths that cannot be read at all.
func Inspect(path string) (string, error) {
	d, err := model.Describe(path)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	sb.WriteString(d.String())
	tok, err := loadTokenizer(path, d)
	if err != nil {
		fmt.Fprintf(&sb, "%-16s NO: %v\n", "tokenizer:", err)
		return sb.String(), nil
	}
	sb.WriteString(Tokenizer(tok))
	return sb.String(), nil
}

// loadTokenizer loads the tokenizer the server would use with this model.
func loadTokenizer(path string, d *model.Description) (*tokenizer.Tokenizer, error) {
	if d.Format == "safetensors" {
		return tokenizer.FromHFDir(d.Path)
	}
	var f *gguf.File
	var err error
	if path == "" {
		f, err = gguf.Parse(bundled.Stories260K)
	} else {
		f, err = gguf.Open(path)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return tokenizer.FromGGUF(f)
}

// Tokenizer describes a tokenizer: what it was built from, its kind and
// size, its special tokens and whether it has a chat template.
func Tokenizer(t *tokenizer.Tokenizer) string {
	var sb strings.Builder
	line := func(k, format string, args ...any) {
		fmt.Fprintf(&sb, "%-16s %s\n", k+":", fmt.Sprintf(format, args...))
	}
	kind := map[string]string{"llama": "SentencePiece-style BPE", "gpt2": "byte-level BPE"}[t.Model()]
	line("tokenizer", "%s from %s (%s), %d tokens", kind, t.Source(), t.Model(), t.VocabSize())
	tokText := func(id int32) string {
		if id < 0 {
			return "none"
		}
		return fmt.Sprintf("%d %q", id, t.TokenText(id))
	}
	line("bos", "%s (added: %v)", tokText(t.BOS()), t.AddBOS())
	line("eos", "%s (added: %v)", tokText(t.EOS()), t.AddEOS())
	var eog []string
	for _, id := range t.EOGs() {
		eog = append(eog, tokText(id))
	}
	line("end of turn", "%s", strings.Join(eog, ", "))
	if tpl := t.ChatTemplate(); tpl != "" {
		line("chat template", "yes (%d bytes)", len(tpl))
	} else {
		line("chat template", "none (plain fallback)")
	}
	return sb.String()
}
