package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strings"
)

// KV is one metadata pair to write. Value is one of the Go types Parse
// returns (uint8 ... float64, bool, string, []string, []float32, []int32,
// []uint32, or []any of one of the scalar types), so a File's Meta can be
// copied key by key.
type KV struct {
	Key   string
	Value any
}

// Alignment of tensor data, GGUF's default (general.alignment is not written).
const Alignment = 32

// Write writes a version-3 GGUF: the metadata in order, then the tensor
// directory of ts (Dims in ggml order, Offset and Size ignored and
// computed), then each tensor's data as data(i, w) writes it, which must
// be exactly ts[i]'s size. Tensors are streamed one at a time, so a file
// larger than memory can be written.
func Write(out io.Writer, kvs []KV, ts []TensorInfo, data func(i int, w io.Writer) error) error {
	w := bufio.NewWriterSize(out, 1<<20)
	e := &enc{w: w}
	e.raw([]byte("GGUF"))
	e.u32(3)
	e.u64(uint64(len(ts)))
	e.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		e.str(kv.Key)
		e.value(kv.Value, true)
		if e.err != nil {
			return fmt.Errorf("gguf: %s: %w", kv.Key, e.err)
		}
	}
	var off int64
	sizes := make([]int64, len(ts))
	for i, t := range ts {
		size := t.Type.RowBytes(t.Elements())
		if size < 0 {
			return fmt.Errorf("gguf: %s: %d elements of type %s cannot be stored", t.Name, t.Elements(), t.Type)
		}
		sizes[i] = size
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(uint64(d))
		}
		e.u32(uint32(t.Type))
		e.u64(uint64(off))
		off = align(off + size)
	}
	e.pad()
	for i := range ts {
		if e.err != nil {
			break
		}
		cw := &countWriter{w: w}
		if err := data(i, cw); err != nil {
			return err
		}
		if cw.n != sizes[i] {
			return fmt.Errorf("gguf: %s: wrote %d bytes of data, its type and shape take %d", ts[i].Name, cw.n, sizes[i])
		}
		e.n += cw.n
		e.pad()
	}
	if e.err != nil {
		return fmt.Errorf("gguf: %w", e.err)
	}
	return w.Flush()
}

func align(n int64) int64 { return (n + Alignment - 1) / Alignment * Alignment }

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type enc struct {
	w   io.Writer
	n   int64 // bytes written, for alignment
	err error
}

func (e *enc) raw(b []byte) {
	if e.err != nil {
		return
	}
	n, err := e.w.Write(b)
	e.n += int64(n)
	e.err = err
}

func (e *enc) u32(v uint32) { e.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (e *enc) u64(v uint64) { e.raw(binary.LittleEndian.AppendUint64(nil, v)) }
func (e *enc) str(s string) {
	e.u64(uint64(len(s)))
	e.raw([]byte(s))
}

func (e *enc) pad() {
	if r := e.n % Alignment; r != 0 {
		e.raw(make([]byte, Alignment-r))
	}
}

// typeOf is v's GGUF value type.
func typeOf(v any) (uint32, bool) {
	switch v.(type) {
	case uint8:
		return vU8, true
	case int8:
		return vI8, true
	case uint16:
		return vU16, true
	case int16:
		return vI16, true
	case uint32:
		return vU32, true
	case int32:
		return vI32, true
	case float32:
		return vF32, true
	case bool:
		return vBool, true
	case string:
		return vString, true
	case uint64:
		return vU64, true
	case int64:
		return vI64, true
	case float64:
		return vF64, true
	case []string, []float32, []int32, []uint32, []any:
		return vArray, true
	}
	return 0, false
}

// value writes v, preceded by its type when typed (array items are not).
func (e *enc) value(v any, typed bool) {
	t, ok := typeOf(v)
	if !ok {
		if e.err == nil {
			e.err = fmt.Errorf("value of type %T cannot be written", v)
		}
		return
	}
	if typed {
		e.u32(t)
	}
	switch v := v.(type) {
	case uint8:
		e.raw([]byte{v})
	case int8:
		e.raw([]byte{byte(v)})
	case uint16:
		e.raw(binary.LittleEndian.AppendUint16(nil, v))
	case int16:
		e.raw(binary.LittleEndian.AppendUint16(nil, uint16(v)))
	case uint32:
		e.u32(v)
	case int32:
		e.u32(uint32(v))
	case float32:
		e.u32(math.Float32bits(v))
	case bool:
		b := byte(0)
		if v {
			b = 1
		}
		e.raw([]byte{b})
	case string:
		e.str(v)
	case uint64:
		e.u64(v)
	case int64:
		e.u64(uint64(v))
	case float64:
		e.u64(math.Float64bits(v))
	case []string:
		e.u32(vString)
		e.u64(uint64(len(v)))
		for _, s := range v {
			e.str(s)
		}
	case []float32:
		e.u32(vF32)
		e.u64(uint64(len(v)))
		for _, f := range v {
			e.u32(math.Float32bits(f))
		}
	case []int32:
		e.u32(vI32)
		e.u64(uint64(len(v)))
		for _, x := range v {
			e.u32(uint32(x))
		}
	case []uint32:
		e.u32(vU32)
		e.u64(uint64(len(v)))
		for _, x := range v {
			e.u32(x)
		}
	case []any:
		// Parse gives []any for arrays of the other scalar types; an empty
		// one has lost its item type, and u32 reads back as empty all the same.
		et := uint32(vU32)
		if len(v) > 0 {
			var ok bool
			if et, ok = typeOf(v[0]); !ok || et == vArray {
				e.err = fmt.Errorf("array of %T cannot be written", v[0])
				return
			}
		}
		e.u32(et)
		e.u64(uint64(len(v)))
		for _, x := range v {
			if xt, _ := typeOf(x); xt != et {
				e.err = fmt.Errorf("array mixes %T with items of type %d", x, et)
				return
			}
			e.value(x, false)
		}
	}
}

// MetaKVs is f's metadata whose keys start with prefix, in file order.
func (f *File) MetaKVs(prefix string) []KV {
	var out []KV
	for _, k := range f.Keys {
		if strings.HasPrefix(k, prefix) {
			out = append(out, KV{k, f.Meta[k]})
		}
	}
	return out
}
