package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/tokenizer"
)

// A draft model is loaded when it shares the model's tokenizer and refused,
// naming the difference, when its vocabulary or its tokens differ.
func TestLoadDraftChecksTheTokenizer(t *testing.T) {
	be := ref.New()
	l, err := model.Load(model.LoadOptions{}, be)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(l.GGUF)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg, err := os.ReadFile("../../testdata/stories260K-hf/config.json")
	if err != nil {
		t.Fatal(err)
	}
	bigger := filepath.Join(dir, "config.json")
	if err := os.WriteFile(bigger, []byte(strings.Replace(string(cfg), `"vocab_size": 512`, `"vocab_size": 1024`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, format, err string
	}{
		{"", "auto", ""}, // the bundled model drafting for itself
		{"../../testdata/stories260K-hf", "auto", ""},
		{"../../testdata/stories260K-hf", "dummy", ""},
		{bigger, "dummy", "the draft model's vocabulary has 1024 tokens, the target's 512"},
	} {
		f := &serveFlags{role: "standalone", specAlgorithm: "draft", specDraftPath: c.path, specDraftFormat: c.format}
		d, err := loadDraft(f, be, l.Model, tok, dummyDType{dt: kernels.F32})
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s (%s): %v", c.path, c.format, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s (%s): error %v, want one saying %q", c.path, c.format, err, c.err)
		}
		if d != nil {
			d.Close()
		}
	}
	// A prefill worker never decodes: it loads no draft.
	if d, err := loadDraft(&serveFlags{role: "prefill", specAlgorithm: "draft", specDraftPath: "/nonexistent"}, be, l.Model, tok, dummyDType{dt: kernels.F32}); d != nil || err != nil {
		t.Errorf("prefill loaded a draft: %v, %v", d, err)
	}
	other, err := loadTokenizer("../../testdata/vocab/ggml-vocab-llama-spm.gguf")
	if err != nil {
		t.Fatal(err)
	}
	if err := sameTokens(tok, other); err == nil || !strings.Contains(err.Error(), "the draft's tokenizer has 32000 tokens, the model's 512") {
		t.Errorf("another tokenizer: %v", err)
	}
	if err := sameTokens(tok, tok); err != nil {
		t.Error(err)
	}
}
