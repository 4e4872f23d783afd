package model

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/batonlm/baton/internal/bundled"
	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/kernels"
)

// LoadOptions says where a model comes from.
type LoadOptions struct {
	// Path is a .gguf file, or a config.json with Format "dummy"; empty means
	// the bundled stories260K.
	Path string
	// Format is auto, gguf or dummy (deterministic random weights with the
	// shape of Path's config).
	Format string
	// DummyDType is the weight dtype of dummy models (default f32).
	DummyDType kernels.DType
	// Progress, when set, is called as tensors load.
	Progress func(done, total int)
}

// Loaded is a model together with the GGUF it came from (which also holds
// the tokenizer); GGUF is the bundled model's when the weights are dummy
// and came from a config.json.
type Loaded struct {
	Model *Model
	GGUF  *gguf.File
	// Name is the file's base name without extension, the default served name.
	Name string
}

// Load reads a model and binds it to be.
func Load(o LoadOptions, be kernels.Backend) (*Loaded, error) {
	var f *gguf.File
	var err error
	name := bundled.Name
	switch {
	case o.Path == "":
		f, err = gguf.Parse(bundled.Stories260K)
	case strings.HasSuffix(o.Path, ".json"):
		if o.Format != "dummy" {
			return nil, fmt.Errorf("model: %s is a config; use --load-format dummy to run it with random weights", o.Path)
		}
		c, err := ConfigFromJSON(o.Path)
		if err != nil {
			return nil, err
		}
		w, err := DummyWeights(&c, o.DummyDType)
		if err != nil {
			return nil, err
		}
		tf, err := gguf.Parse(bundled.Stories260K)
		if err != nil {
			return nil, err
		}
		return &Loaded{Model: New(c, w, be), GGUF: tf, Name: NameFromPath(filepath.Dir(o.Path))}, nil
	default:
		f, err = gguf.Open(o.Path)
		name = NameFromPath(o.Path)
	}
	if err != nil {
		return nil, err
	}
	c, err := ConfigFromGGUF(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	var w *Weights
	switch o.Format {
	case "", "auto", "gguf":
		w, err = WeightsFromGGUF(f, &c, o.Progress)
	case "dummy":
		w, err = DummyWeights(&c, o.DummyDType)
	default:
		err = fmt.Errorf("model: unknown load format %q (auto, gguf, dummy)", o.Format)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	m := New(c, w, be)
	m.closer = f.Close
	return &Loaded{Model: m, GGUF: f, Name: name}, nil
}

// NameFromPath is a model file's base name without extension: the default
// served model name.
func NameFromPath(p string) string {
	b := filepath.Base(p)
	return strings.TrimSuffix(b, filepath.Ext(b))
}
