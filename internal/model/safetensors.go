package model

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/batonlm/baton/internal/mmap"
)

// The safetensors format: an 8-byte little-endian header length N, N bytes
// of JSON, then the data buffer. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} with offsets relative to
// the start of the data buffer; an optional "__metadata__" entry maps
// strings to strings.

// maxSafetensorsHeader is the header size the reference implementation
// accepts; anything larger is not a real file.
const maxSafetensorsHeader = 100_000_000

// safetensorsDTypes gives the element size of every dtype the format
// defines with whole bytes per element. Others are refused when parsing.
var safetensorsDTypes = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// SafetensorsTensor describes one tensor of a safetensors file.
type SafetensorsTensor struct {
	Name  string
	DType string  // as written in the file: F32, F16, BF16, ...
	Shape []int64 // row-major, outermost first ([out, in] for a matrix)
	// Offset is the tensor's first byte in the file (not in the data
	// buffer) and Size its length in bytes.
	Offset, Size int64
}

// Elements is the product of the shape (1 for a scalar).
func (t SafetensorsTensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// SafetensorsFile is a parsed safetensors file. Tensor data stays valid
// until Close.
type SafetensorsFile struct {
	// Metadata is the header's __metadata__ (nil when absent).
	Metadata map[string]string
	// Tensors are in header order.
	Tensors []SafetensorsTensor

	byName map[string]int
	data   []byte
	mapped bool
}

// OpenSafetensors memory-maps path read-only and parses its header; tensor
// bytes are served from the mapping, never copied.
func OpenSafetensors(path string) (*SafetensorsFile, error) {
	data, err := mmap.File(path, 8)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	f, err := ParseSafetensors(data)
	if err != nil {
		_ = mmap.Unmap(data)
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	f.mapped = true
	return f, nil
}

// Prefault reads the whole of a mapped file into memory now (see
// mmap.Populate).
func (f *SafetensorsFile) Prefault() {
	if f.mapped {
		mmap.Populate(f.data)
	}
}

// ParseSafetensors parses a whole safetensors image held in memory. It
// refuses malformed headers, unknown dtypes, sizes that disagree with the
// shape, offsets outside the data and tensors that overlap. The returned
// file refers to data.
func ParseSafetensors(data []byte) (*SafetensorsFile, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("safetensors: %d bytes is too short for a header length", len(data))
	}
	n := binary.LittleEndian.Uint64(data)
	if n > maxSafetensorsHeader {
		return nil, fmt.Errorf("safetensors: header length %d is larger than the %d allowed", n, maxSafetensorsHeader)
	}
	if n > uint64(len(data)-8) {
		return nil, fmt.Errorf("safetensors: header length %d runs past the end of the %d-byte file", n, len(data))
	}
	hdr := data[8 : 8+n]
	start := int64(8 + n)
	bufLen := int64(len(data)) - start
	if t := bytes.TrimLeft(hdr, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, errors.New("safetensors: header is not a JSON object")
	}
	f := &SafetensorsFile{byName: map[string]int{}, data: data}
	dec := json.NewDecoder(bytes.NewReader(hdr))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil { // the opening brace
		return nil, fmt.Errorf("safetensors: malformed header: %w", err)
	}
	seenMeta := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("safetensors: malformed header: %w", err)
		}
		name, _ := tok.(string)
		if name == "__metadata__" {
			if seenMeta {
				return nil, errors.New("safetensors: header has __metadata__ twice")
			}
			seenMeta = true
			var meta map[string]string
			if err := dec.Decode(&meta); err != nil {
				return nil, fmt.Errorf("safetensors: __metadata__ must map strings to strings: %w", err)
			}
			f.Metadata = meta
			continue
		}
		if _, dup := f.byName[name]; dup {
			return nil, fmt.Errorf("safetensors: tensor %q is listed twice", name)
		}
		var e struct {
			DType   *string  `json:"dtype"`
			Shape   *[]int64 `json:"shape"`
			Offsets *[]int64 `json:"data_offsets"`
		}
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("safetensors: malformed header entry %q: %w", name, err)
		}
		if e.DType == nil || e.Shape == nil || e.Offsets == nil {
			return nil, fmt.Errorf("safetensors: tensor %q lacks dtype, shape or data_offsets", name)
		}
		size, ok := safetensorsDTypes[*e.DType]
		if !ok {
			return nil, fmt.Errorf("safetensors: tensor %q has unknown dtype %q", name, *e.DType)
		}
		if len(*e.Shape) > 8 {
			return nil, fmt.Errorf("safetensors: tensor %q has %d dimensions", name, len(*e.Shape))
		}
		for _, d := range *e.Shape {
			if d < 0 {
				return nil, fmt.Errorf("safetensors: tensor %q has shape %v", name, *e.Shape)
			}
			if d > 0 && size > bufLen/d {
				return nil, fmt.Errorf("safetensors: tensor %q of shape %v is larger than the file", name, *e.Shape)
			}
			size *= d
		}
		if len(*e.Offsets) != 2 {
			return nil, fmt.Errorf("safetensors: tensor %q: data_offsets must be [begin, end], is %v", name, *e.Offsets)
		}
		b, end := (*e.Offsets)[0], (*e.Offsets)[1]
		if b < 0 || end < b || end > bufLen {
			return nil, fmt.Errorf("safetensors: tensor %q: data_offsets [%d, %d] lie outside the %d-byte data buffer", name, b, end, bufLen)
		}
		if end-b != size {
			return nil, fmt.Errorf("safetensors: tensor %q: %s%v needs %d bytes, data_offsets give %d", name, *e.DType, *e.Shape, size, end-b)
		}
		f.byName[name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, SafetensorsTensor{Name: name, DType: *e.DType, Shape: *e.Shape, Offset: start + b, Size: size})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("safetensors: malformed header: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("safetensors: header has data after its JSON object")
	}
	// No two tensors may share bytes.
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		ta, tb := f.Tensors[a], f.Tensors[b]
		return cmp.Or(cmp.Compare(ta.Offset, tb.Offset), cmp.Compare(ta.Size, tb.Size))
	})
	var prev *SafetensorsTensor
	for _, i := range order {
		t := &f.Tensors[i]
		if t.Size == 0 {
			continue
		}
		if prev != nil && t.Offset < prev.Offset+prev.Size {
			return nil, fmt.Errorf("safetensors: tensors %q and %q overlap", prev.Name, t.Name)
		}
		prev = t
	}
	return f, nil
}

// Tensor returns a tensor's description and its bytes.
func (f *SafetensorsFile) Tensor(name string) (SafetensorsTensor, []byte, error) {
	i, ok := f.byName[name]
	if !ok {
		return SafetensorsTensor{}, nil, fmt.Errorf("safetensors: no tensor %q", name)
	}
	t := f.Tensors[i]
	return t, f.data[t.Offset : t.Offset+t.Size : t.Offset+t.Size], nil
}

// HasTensor reports whether the file holds a tensor of that name.
func (f *SafetensorsFile) HasTensor(name string) bool { _, ok := f.byName[name]; return ok }

// Close unmaps the file. Tensor data must not be used afterwards.
func (f *SafetensorsFile) Close() error {
	if !f.mapped || f.data == nil {
		return nil
	}
	err := mmap.Unmap(f.data)
	f.data = nil
	return err
}

// describeShape formats a shape like [512 64].
func describeShape(s []int64) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
