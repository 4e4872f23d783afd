package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/tokenizer"
)

// hfTokenizerFiles are the files of a Hugging Face directory that the
// tokenizer, its chat template and the generation defaults are read from
// (tokenizer.FromHFDir, model.ReadGenerationConfig).
var hfTokenizerFiles = []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
	"generation_config.json", "config.json", "chat_template.jinja", "chat_template.json"}

// tokenizerFiles are the files this worker's tokenizer came from, for a
// router started without --model: a Hugging Face directory's tokenizer
// files, or the metadata of the GGUF that holds the tokenizer.
func (le *loadedEngine) tokenizerFiles(f *serveFlags) (*pdv1.TokenizerFiles, error) {
	out := &pdv1.TokenizerFiles{Files: map[string][]byte{}, ServedModel: le.name, TokenizerFingerprint: le.tok.Fingerprint()}
	dir, ggufPath := le.loaded.Dir, ""
	if f.tokenizerPath != "" {
		var ok bool
		if dir, ok = model.HFDir(f.tokenizerPath); !ok {
			dir, ggufPath = "", f.tokenizerPath
		}
	}
	switch {
	case dir != "":
		out.Format = "hf"
		for _, name := range hfTokenizerFiles {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
			out.Files[name] = b
		}
	case ggufPath != "":
		gf, err := gguf.Open(ggufPath)
		if err != nil {
			return nil, err
		}
		out.Format, out.Files["model.gguf"] = "gguf", gf.MetadataOnly()
		_ = gf.Close()
	default:
		out.Format, out.Files["model.gguf"] = "gguf", le.loaded.GGUF.MetadataOnly()
	}
	out.Sha256 = pdv1.TokenizerSum(out.Files)
	return out, nil
}

// learnedTokenizer loads what a worker's Tokenizer RPC handed over, after
// checking the files against their hash and the tokenizer against the
// fingerprint the worker reports. dir, for a Hugging Face directory, holds
// the files (for the generation defaults) until the caller removes it.
func learnedTokenizer(tf *pdv1.TokenizerFiles) (tok *tokenizer.Tokenizer, dir string, err error) {
	if got := pdv1.TokenizerSum(tf.Files); got != tf.Sha256 {
		return nil, "", fmt.Errorf("the tokenizer files do not match their hash (%s, sent %s)", got, tf.Sha256)
	}
	switch tf.Format {
	case "gguf":
		gf, err := gguf.Parse(tf.Files["model.gguf"])
		if err != nil {
			return nil, "", err
		}
		tok, err = tokenizer.FromGGUF(gf)
		if err != nil {
			return nil, "", err
		}
	case "hf":
		dir, err = os.MkdirTemp("", "baton-tokenizer-")
		if err != nil {
			return nil, "", err
		}
		for name, b := range tf.Files {
			if name != filepath.Base(name) || name == "." || name == ".." {
				_ = os.RemoveAll(dir)
				return nil, "", fmt.Errorf("bad tokenizer file name %q", name)
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				_ = os.RemoveAll(dir)
				return nil, "", err
			}
		}
		if tok, err = tokenizer.FromHFDir(dir); err != nil {
			_ = os.RemoveAll(dir)
			return nil, "", err
		}
	default:
		return nil, "", fmt.Errorf("unknown tokenizer format %q", tf.Format)
	}
	if fp := tok.Fingerprint(); fp != tf.TokenizerFingerprint {
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
		return nil, "", fmt.Errorf("the tokenizer loaded from the files has fingerprint %s, the worker's %s", fp, tf.TokenizerFingerprint)
	}
	return tok, dir, nil
}
