// Package gguf reads GGUF model files: the metadata key/value store and the
// tensor directory, with tensor data served from a read-only memory map so
// that weights are paged in by the kernel rather than copied.
package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/batonlm/baton/internal/mmap"
)

// Type is a ggml tensor element type as stored in the tensor directory.
type Type uint32

// The ggml element types baton knows by name. Others can be listed but not loaded.
const (
	TypeF32  Type = 0
	TypeF16  Type = 1
	TypeQ4_0 Type = 2
	TypeQ4_1 Type = 3
	TypeQ5_0 Type = 6
	TypeQ5_1 Type = 7
	TypeQ8_0 Type = 8
	TypeQ2_K Type = 10
	TypeQ3_K Type = 11
	TypeQ4_K Type = 12
	TypeQ5_K Type = 13
	TypeQ6_K Type = 14
	TypeBF16 Type = 30
)

// typeLayout: elements per block and bytes per block.
var typeLayout = map[Type]struct {
	name         string
	block, bytes int64
}{
	TypeF32:  {"F32", 1, 4},
	TypeF16:  {"F16", 1, 2},
	TypeQ4_0: {"Q4_0", 32, 18},
	TypeQ4_1: {"Q4_1", 32, 20},
	TypeQ5_0: {"Q5_0", 32, 22},
	TypeQ5_1: {"Q5_1", 32, 24},
	TypeQ8_0: {"Q8_0", 32, 34},
	TypeQ2_K: {"Q2_K", 256, 84},
	TypeQ3_K: {"Q3_K", 256, 110},
	TypeQ4_K: {"Q4_K", 256, 144},
	TypeQ5_K: {"Q5_K", 256, 176},
	TypeQ6_K: {"Q6_K", 256, 210},
	TypeBF16: {"BF16", 1, 2},
}

func (t Type) String() string {
	if l, ok := typeLayout[t]; ok {
		return l.name
	}
	return fmt.Sprintf("ggml_type(%d)", uint32(t))
}

// RowBytes is the storage size of n elements of type t, or -1 when t is not
// a type baton can address.
func (t Type) RowBytes(n int64) int64 {
	l, ok := typeLayout[t]
	if !ok || n%l.block != 0 {
		return -1
	}
	return n / l.block * l.bytes
}

// TensorInfo describes one tensor. Dims are in ggml order: Dims[0] is the
// innermost (contiguous) dimension, so a matrix [in, out] has rows of length in.
type TensorInfo struct {
	Name   string
	Dims   []int64
	Type   Type
	Offset int64 // relative to the start of the data section
	Size   int64
}

// Elements is the product of the dimensions.
func (t TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// File is an open GGUF file. Its tensor data stays valid until Close.
type File struct {
	Version uint32
	Meta    map[string]any
	// Keys lists metadata keys in file order.
	Keys    []string
	Tensors []TensorInfo

	byName    map[string]int
	data      []byte // the whole mapping
	mapped    bool   // data is a mapping of a file (Open), not bytes given to Parse
	dataStart int64
	metaEnd   int64 // where the metadata ends and the tensor infos begin
}

// MetadataOnly is a GGUF of f's metadata alone: the header and every key,
// no tensor. It carries the tokenizer and chat template at a fraction of
// the weights' size (what a worker hands a router that has no model).
func (f *File) MetadataOnly() []byte {
	out := append([]byte(nil), f.data[:f.metaEnd]...)
	clear(out[8:16]) // the tensor count
	return out
}

const maxCount = 1 << 26 // no real file has this many keys, tensors or array items

// Open maps path and parses its header.
func Open(path string) (*File, error) {
	data, err := mmap.File(path, 24)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		_ = mmap.Unmap(data)
		return nil, fmt.Errorf("gguf: %s: %w", path, err)
	}
	f.mapped = true
	return f, nil
}

// Prefault reads the whole of an opened file into memory now (see
// mmap.Populate); for a File from Parse it does nothing.
func (f *File) Prefault() {
	if f.mapped {
		mmap.Populate(f.data)
	}
}

// Close unmaps the file. Tensor data must not be used afterwards.
func (f *File) Close() error {
	if f.data == nil {
		return nil
	}
	err := mmap.Unmap(f.data)
	f.data = nil
	return err
}

type reader struct {
	b   []byte
	off int64
	err error
}

func (r *reader) take(n int64) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || r.off+n > int64(len(r.b)) || r.off+n < r.off {
		r.err = fmt.Errorf("truncated at offset %d (need %d bytes)", r.off, n)
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) u8() uint8 {
	if s := r.take(1); s != nil {
		return s[0]
	}
	return 0
}
func (r *reader) u16() uint16 {
	if s := r.take(2); s != nil {
		return binary.LittleEndian.Uint16(s)
	}
	return 0
}
func (r *reader) u32() uint32 {
	if s := r.take(4); s != nil {
		return binary.LittleEndian.Uint32(s)
	}
	return 0
}
func (r *reader) u64() uint64 {
	if s := r.take(8); s != nil {
		return binary.LittleEndian.Uint64(s)
	}
	return 0
}
func (r *reader) str() string {
	n := r.u64()
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("string length %d at offset %d exceeds file", n, r.off)
		return ""
	}
	return string(r.take(int64(n)))
}

// metadata value types
const (
	vU8 = iota
	vI8
	vU16
	vI16
	vU32
	vI32
	vF32
	vBool
	vString
	vArray
	vU64
	vI64
	vF64
)

func (r *reader) value(t uint32, depth int) any {
	switch t {
	case vU8:
		return r.u8()
	case vI8:
		return int8(r.u8())
	case vU16:
		return r.u16()
	case vI16:
		return int16(r.u16())
	case vU32:
		return r.u32()
	case vI32:
		return int32(r.u32())
	case vF32:
		return math.Float32frombits(r.u32())
	case vBool:
		return r.u8() != 0
	case vString:
		return r.str()
	case vU64:
		return r.u64()
	case vI64:
		return int64(r.u64())
	case vF64:
		return math.Float64frombits(r.u64())
	case vArray:
		if depth > 2 {
			r.err = errors.New("arrays nested too deep")
			return nil
		}
		et := r.u32()
		n := r.u64()
		if n > maxCount || n > uint64(len(r.b)) {
			r.err = fmt.Errorf("array of %d items is implausible", n)
			return nil
		}
		switch et {
		case vString:
			out := make([]string, 0, n)
			for i := uint64(0); i < n && r.err == nil; i++ {
				out = append(out, r.str())
			}
			return out
		case vF32:
			out := make([]float32, n)
			for i := range out {
				out[i] = math.Float32frombits(r.u32())
			}
			return out
		case vI32:
			out := make([]int32, n)
			for i := range out {
				out[i] = int32(r.u32())
			}
			return out
		case vU32:
			out := make([]uint32, n)
			for i := range out {
				out[i] = r.u32()
			}
			return out
		default:
			out := make([]any, 0, min(n, 1024))
			for i := uint64(0); i < n && r.err == nil; i++ {
				out = append(out, r.value(et, depth+1))
			}
			return out
		}
	}
	r.err = fmt.Errorf("unknown metadata value type %d", t)
	return nil
}

// Parse reads a GGUF image held in memory. The returned File refers to data.
func Parse(data []byte) (*File, error) {
	r := &reader{b: data}
	if string(r.take(4)) != "GGUF" {
		return nil, errors.New("not a GGUF file (bad magic)")
	}
	f := &File{Version: r.u32(), Meta: map[string]any{}, byName: map[string]int{}, data: data}
	if f.Version < 2 || f.Version > 3 {
		return nil, fmt.Errorf("unsupported GGUF version %d", f.Version)
	}
	nt, nkv := r.u64(), r.u64()
	if nt > maxCount || nkv > maxCount {
		return nil, fmt.Errorf("implausible header: %d tensors, %d keys", nt, nkv)
	}
	for i := uint64(0); i < nkv && r.err == nil; i++ {
		k := r.str()
		v := r.value(r.u32(), 0)
		if _, dup := f.Meta[k]; !dup {
			f.Keys = append(f.Keys, k)
		}
		f.Meta[k] = v
	}
	f.metaEnd = r.off
	for i := uint64(0); i < nt && r.err == nil; i++ {
		ti := TensorInfo{Name: r.str()}
		nd := r.u32()
		if nd > 4 {
			return nil, fmt.Errorf("tensor %q has %d dimensions", ti.Name, nd)
		}
		for j := uint32(0); j < nd; j++ {
			d := int64(r.u64())
			if d < 0 || d > 1<<40 {
				return nil, fmt.Errorf("tensor %q has dimension %d", ti.Name, d)
			}
			ti.Dims = append(ti.Dims, d)
		}
		ti.Type = Type(r.u32())
		ti.Offset = int64(r.u64())
		if _, dup := f.byName[ti.Name]; dup {
			return nil, fmt.Errorf("duplicate tensor %q", ti.Name)
		}
		f.byName[ti.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, ti)
	}
	if r.err != nil {
		return nil, r.err
	}
	align := int64(32)
	if a, ok := f.Uint("general.alignment"); ok {
		if a == 0 || a&(a-1) != 0 || a > 1<<16 {
			return nil, fmt.Errorf("bad general.alignment %d", a)
		}
		align = int64(a)
	}
	f.dataStart = (r.off + align - 1) / align * align
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if len(t.Dims) == 0 {
			return nil, fmt.Errorf("tensor %q has no dimensions", t.Name)
		}
		rows := t.Elements() / t.Dims[0]
		rb := t.Type.RowBytes(t.Dims[0])
		if rb >= 0 {
			t.Size = rb * rows
			if t.Offset < 0 || f.dataStart+t.Offset+t.Size > int64(len(data)) || t.Offset+t.Size < t.Offset {
				return nil, fmt.Errorf("tensor %q (%d bytes at %d) lies outside the file", t.Name, t.Size, t.Offset)
			}
		}
	}
	return f, nil
}

// Tensor returns a tensor's description and raw bytes.
func (f *File) Tensor(name string) (TensorInfo, []byte, error) {
	i, ok := f.byName[name]
	if !ok {
		return TensorInfo{}, nil, fmt.Errorf("gguf: no tensor %q", name)
	}
	t := f.Tensors[i]
	if t.Type.RowBytes(t.Dims[0]) < 0 {
		return t, nil, fmt.Errorf("gguf: tensor %q has unsupported type %s", name, t.Type)
	}
	start := f.dataStart + t.Offset
	return t, f.data[start : start+t.Size : start+t.Size], nil
}

// HasTensor reports whether the file holds a tensor of that name.
func (f *File) HasTensor(name string) bool { _, ok := f.byName[name]; return ok }

// String returns a string value.
func (f *File) String(key string) (string, bool) {
	s, ok := f.Meta[key].(string)
	return s, ok
}

// Uint returns an unsigned integer value of any width (negative values are refused).
func (f *File) Uint(key string) (uint64, bool) {
	switch v := f.Meta[key].(type) {
	case uint8:
		return uint64(v), true
	case uint16:
		return uint64(v), true
	case uint32:
		return uint64(v), true
	case uint64:
		return v, true
	case int8:
		return uint64(v), v >= 0
	case int16:
		return uint64(v), v >= 0
	case int32:
		return uint64(v), v >= 0
	case int64:
		return uint64(v), v >= 0
	}
	return 0, false
}

// Float returns a floating point value.
func (f *File) Float(key string) (float64, bool) {
	switch v := f.Meta[key].(type) {
	case float32:
		return float64(v), true
	case float64:
		return v, true
	}
	return 0, false
}

// Bool returns a boolean value.
func (f *File) Bool(key string) (bool, bool) {
	b, ok := f.Meta[key].(bool)
	return b, ok
}

// Strings returns a string array.
func (f *File) Strings(key string) ([]string, bool) {
	s, ok := f.Meta[key].([]string)
	return s, ok
}

// Float32s returns a float32 array.
func (f *File) Float32s(key string) ([]float32, bool) {
	s, ok := f.Meta[key].([]float32)
	return s, ok
}

// Int32s returns an int32 array; uint32 arrays are converted when every value fits.
func (f *File) Int32s(key string) ([]int32, bool) {
	switch v := f.Meta[key].(type) {
	case []int32:
		return v, true
	case []uint32:
		out := make([]int32, len(v))
		for i, x := range v {
			if x > math.MaxInt32 {
				return nil, false
			}
			out[i] = int32(x)
		}
		return out, true
	}
	return nil, false
}
