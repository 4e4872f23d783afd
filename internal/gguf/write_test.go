package gguf

import (
	"bytes"
	"io"
	"reflect"
	"testing"

	"github.com/batonlm/baton/internal/bundled"
)

// What Write writes, Parse reads back: every value type, the bundled
// model's tokenizer metadata copied key by key, and tensors at aligned
// offsets with their bytes.
func TestWriteRoundTrip(t *testing.T) {
	src, err := Parse(bundled.Stories260K)
	if err != nil {
		t.Fatal(err)
	}
	tok := src.MetaKVs("tokenizer.")
	if len(tok) == 0 {
		t.Fatal("the bundled model has no tokenizer metadata")
	}
	kvs := append([]KV{
		{"general.architecture", "llama"}, {"u8", uint8(7)}, {"i8", int8(-7)}, {"u16", uint16(700)}, {"i16", int16(-700)},
		{"u32", uint32(70000)}, {"i32", int32(-70000)}, {"f32", float32(1.5)}, {"b", true}, {"u64", uint64(1 << 40)},
		{"i64", int64(-1 << 40)}, {"f64", 2.25}, {"strs", []string{"a", "", "ü"}}, {"f32s", []float32{1, -2}},
		{"i32s", []int32{3, -4}}, {"u32s", []uint32{5}}, {"bools", []any{true, false}},
	}, tok...)
	ts := []TensorInfo{
		{Name: "a", Dims: []int64{3}, Type: TypeF32},      // 12 bytes: the next starts padded
		{Name: "b", Dims: []int64{32, 2}, Type: TypeQ8_0}, // 68 bytes
		{Name: "c", Dims: []int64{4, 4}, Type: TypeF16},   // 32 bytes
	}
	payload := func(i int) []byte {
		b := make([]byte, ts[i].Type.RowBytes(ts[i].Elements()))
		for j := range b {
			b[j] = byte(i*31 + j)
		}
		return b
	}
	var buf bytes.Buffer
	err = Write(&buf, kvs, ts, func(i int, w io.Writer) error {
		_, err := w.Write(payload(i))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Keys) != len(kvs) {
		t.Fatalf("%d keys read back, %d written", len(f.Keys), len(kvs))
	}
	for i, kv := range kvs {
		if f.Keys[i] != kv.Key || !reflect.DeepEqual(f.Meta[kv.Key], kv.Value) {
			t.Errorf("key %d: read %s = %#v, wrote %s = %#v", i, f.Keys[i], f.Meta[f.Keys[i]], kv.Key, kv.Value)
		}
	}
	for i := range ts {
		info, got, err := f.Tensor(ts[i].Name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Offset%Alignment != 0 {
			t.Errorf("%s at offset %d, not aligned", info.Name, info.Offset)
		}
		if !bytes.Equal(got, payload(i)) {
			t.Errorf("%s: data differs", info.Name)
		}
	}

	// A data callback that writes the wrong amount is an error, not a bad file.
	err = Write(io.Discard, nil, ts[:1], func(int, io.Writer) error { return nil })
	if err == nil {
		t.Error("Write accepted a tensor whose data was not written")
	}
}
