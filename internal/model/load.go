package model

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/batonlm/baton/internal/bundled"
	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/kernels"
)

// LoadOptions says where a model comes from.
type LoadOptions struct {
	// Path is a .gguf file; a Hugging Face model directory (config.json
	// with model.safetensors or shards), or that directory's config.json;
	// or a bare config.json with Format "dummy". Empty means the bundled
	// stories260K.
	Path string
	// Format is auto, gguf, safetensors or dummy (deterministic random
	// weights with the shape of the model's config).
	Format string
	// DummyDType is the weight dtype of dummy models (default f32).
	DummyDType kernels.DType
	// DummyPick, when set, chooses each dummy matrix's dtype by its kind
	// in place of DummyDType (a quantised file's mix, such as Q4KM).
	DummyPick func(kind string) kernels.DType
	// Progress, when set, is called as tensors load.
	Progress func(done, total int)
	// HostCopy copies the weight matrices out of the file's mapping into
	// memory of their own in huge pages (see copyToHost): what the CPU
	// backend wants. Without it they are read in from the mapping before
	// the first request and served from it.
	HostCopy bool
}

// Loaded is a model together with where its tokenizer is.
//
// For a GGUF model, GGUF is the file (it holds the tokenizer) and Dir is
// "". For a Hugging Face directory, Dir is the directory (its
// tokenizer.json is the tokenizer) and GGUF is nil. Dummy weights keep the
// same rule: a HF directory with a tokenizer.json gives Dir; a bare
// config.json (or a directory without tokenizer.json) gives the bundled
// model's GGUF, as the tokenizer to use.
type Loaded struct {
	Model *Model
	GGUF  *gguf.File
	// Dir is the Hugging Face model directory, or "".
	Dir string
	// Name is the file's base name without extension (the directory's
	// name for a HF model), the default served name.
	Name string
	// Format is what the weights came from: gguf, safetensors or dummy.
	Format string
	// Generation is generation_config.json's content for a HF directory
	// (EOS ids and default sampling); empty otherwise.
	Generation GenerationConfig
	// Copied: the weight matrices were copied into memory of their own
	// (LoadOptions.HostCopy, where there was room for them).
	Copied bool
}

func (o LoadOptions) dummyWeights(c *Config) (*Weights, error) {
	if o.DummyPick != nil {
		return DummyWeightsMixed(c, o.DummyPick)
	}
	return DummyWeights(c, o.DummyDType)
}

// Load reads a model and binds it to be.
func Load(o LoadOptions, be kernels.Backend) (*Loaded, error) {
	var f *gguf.File
	var err error
	name := bundled.Name
	if dir, ok := HFDir(o.Path); ok {
		return loadHF(dir, o, be)
	}
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
		w, err := o.dummyWeights(&c)
		if err != nil {
			return nil, err
		}
		tf, err := gguf.Parse(bundled.Stories260K)
		if err != nil {
			return nil, err
		}
		return &Loaded{Model: New(c, w, be), GGUF: tf, Name: NameFromPath(filepath.Dir(o.Path)), Format: "dummy"}, nil
	default:
		if st, serr := os.Stat(o.Path); serr == nil && st.IsDir() {
			return nil, fmt.Errorf("model: %s is a directory without config.json (not a Hugging Face model)", o.Path)
		}
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
	format := "gguf"
	switch o.Format {
	case "", "auto", "gguf":
		w, err = WeightsFromGGUF(f, &c, o.Progress)
	case "dummy":
		w, err = o.dummyWeights(&c)
		format = "dummy"
	case "safetensors":
		err = fmt.Errorf("model: --load-format safetensors needs a Hugging Face model directory, not %s", o.Path)
	default:
		err = fmt.Errorf("model: unknown load format %q (auto, gguf, safetensors, dummy)", o.Format)
	}
	if err == nil {
		err = checkDTypes(w, be)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	closer, copied := f.Close, false
	if format == "gguf" {
		if closer, copied, err = place(w, f.Prefault, f.Close, o.HostCopy); err != nil {
			f.Close()
			return nil, err
		}
	}
	m := New(c, w, be)
	m.closer = closer
	return &Loaded{Model: m, GGUF: f, Name: name, Format: format, Copied: copied}, nil
}

// place puts the weights where they are served from: a copy in memory of
// their own (hostCopy, where there is room) or the file mapping, read in
// now (prefault). It returns the model's closer (closeFile, and with a
// copy the release of its memory after it) and whether it copied.
func place(w *Weights, prefault func(), closeFile func() error, hostCopy bool) (func() error, bool, error) {
	if !hostCopy {
		prefault()
		return closeFile, false, nil
	}
	free, err := copyToHost(w)
	if errors.Is(err, errNoRoom) {
		prefault()
		return closeFile, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return func() error {
		err := closeFile()
		if ferr := free(); err == nil {
			err = ferr
		}
		return err
	}, true, nil
}

// checkDTypes refuses, at load time, weights a backend cannot multiply
// (one whose kernels lack a format: kernels.DTypeSupporter), rather than
// letting the first request fail.
func checkDTypes(w *Weights, be kernels.Backend) error {
	s, ok := be.(kernels.DTypeSupporter)
	if !ok {
		return nil
	}
	var err error
	w.eachMatrix(func(name string, m *kernels.Matrix) {
		if err == nil && !s.SupportsDType(m.DType) {
			err = fmt.Errorf("model: the %s backend does not run %s weights, the format of %s; use --device cpu", be.Name(), m.DType, name)
		}
	})
	return err
}

// loadHF loads a Hugging Face model directory: config.json, the
// safetensors weights (memory-mapped, kept in their dtype) and
// generation_config.json.
func loadHF(dir string, o LoadOptions, be kernels.Backend) (*Loaded, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	name := NameFromPath(dir)
	gen, err := ReadGenerationConfig(dir)
	if err != nil {
		return nil, err
	}
	l := &Loaded{Dir: dir, Name: name, Generation: gen}
	switch o.Format {
	case "dummy":
		c, err := parseHFConfig(b, false)
		if err != nil {
			return nil, fmt.Errorf("model: %s: %w", filepath.Join(dir, "config.json"), err)
		}
		c.Name = name
		w, err := o.dummyWeights(&c)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
			// No tokenizer here: use the bundled model's, as a bare
			// config.json does.
			if l.GGUF, err = gguf.Parse(bundled.Stories260K); err != nil {
				return nil, err
			}
			l.Dir = ""
		}
		l.Model, l.Format = New(c, w, be), "dummy"
		return l, nil
	case "", "auto", "safetensors":
	case "gguf":
		return nil, fmt.Errorf("model: %s is a Hugging Face directory, not a GGUF file", dir)
	default:
		return nil, fmt.Errorf("model: unknown load format %q (auto, gguf, safetensors, dummy)", o.Format)
	}
	c, err := parseHFConfig(b, true)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", filepath.Join(dir, "config.json"), err)
	}
	c.Name = name
	hw, err := openHFWeights(dir)
	if err != nil {
		return nil, err
	}
	w, err := weightsFromHF(hw, &c, o.Progress)
	if err != nil {
		hw.Close()
		return nil, err
	}
	prefault := func() {
		for _, f := range hw.files {
			f.Prefault()
		}
	}
	closer, copied, err := place(w, prefault, hw.Close, o.HostCopy)
	if err != nil {
		hw.Close()
		return nil, err
	}
	m := New(c, w, be)
	m.closer = closer
	l.Copied = copied
	l.Model, l.Format = m, "safetensors"
	return l, nil
}

// NameFromPath is the default served model name for a model path: a model
// file's base name without extension, or the directory's name for a
// Hugging Face model (given as the directory or its config.json).
func NameFromPath(p string) string {
	if dir, ok := HFDir(p); ok {
		if abs, err := filepath.Abs(dir); err == nil {
			dir = abs
		}
		return filepath.Base(dir)
	}
	b := filepath.Base(p)
	return strings.TrimSuffix(b, filepath.Ext(b))
}
