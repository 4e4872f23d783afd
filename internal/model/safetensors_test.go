package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/model/hftest"
)

// rawFile builds a file from a literal header and a data buffer.
func rawFile(header string, data int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, data)...)
}

func TestSafetensorsRoundTrip(t *testing.T) {
	vals := []float32{1, -2, 3.5, 0.25, 1e-3, -7}
	img := hftest.EncodeSafetensors([]hftest.Tensor{
		{Name: "a", DType: "F32", Shape: []int64{2, 3}, Vals: vals},
		{Name: "b", DType: "BF16", Shape: []int64{6}, Vals: vals},
		{Name: "c", DType: "F16", Shape: []int64{3, 2}, Vals: vals},
		{Name: "empty", DType: "F32", Shape: []int64{0, 4}, Vals: nil},
		{Name: "ids", DType: "I64", Shape: []int64{2}, Raw: make([]byte, 16)},
	}, map[string]string{"format": "pt"})
	f, err := ParseSafetensors(img)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["format"] != "pt" || len(f.Tensors) != 5 {
		t.Fatalf("metadata %v, %d tensors", f.Metadata, len(f.Tensors))
	}
	for _, name := range []string{"a", "b", "c"} {
		ti, data, err := f.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		dt := map[string]kernels.DType{"F32": kernels.F32, "F16": kernels.F16, "BF16": kernels.BF16}[ti.DType]
		m := kernels.Matrix{DType: dt, Rows: 1, Cols: 6, Data: data}
		if err := m.Validate(); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, 6)
		m.Row(0, got)
		for i := range got {
			if math.Abs(float64(got[i]-vals[i])) > 0.02*math.Abs(float64(vals[i])) {
				t.Fatalf("%s[%d] = %v, want %v", name, i, got[i], vals[i])
			}
		}
	}
	if ti, data, _ := f.Tensor("empty"); ti.Elements() != 0 || len(data) != 0 {
		t.Fatalf("empty tensor: %+v %d bytes", ti, len(data))
	}
	if _, _, err := f.Tensor("nope"); err == nil {
		t.Fatal("a missing tensor was found")
	}
}

func TestSafetensorsRejectsMalformed(t *testing.T) {
	tensor := func(dtype, shape, offsets string) string {
		return fmt.Sprintf(`{"w":{"dtype":"%s","shape":%s,"data_offsets":%s}}`, dtype, shape, offsets)
	}
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"short", []byte{1, 2, 3}, "too short"},
		{"header past the end", append(binary.LittleEndian.AppendUint64(nil, 100), "{}"...), "runs past the end"},
		{"huge header length", binary.LittleEndian.AppendUint64(nil, 1<<62), "larger than"},
		{"not an object", rawFile(`[1, 2]`, 0), "not a JSON object"},
		{"bad json", rawFile(`{"w":`, 0), "malformed header"},
		{"bad key", rawFile(`{7:1}`, 0), "malformed header"},
		{"trailing data", rawFile(`{} {}`, 0), "after its JSON object"},
		{"unknown dtype", rawFile(tensor("F33", "[2]", "[0,8]"), 8), "unknown dtype"},
		{"missing field", rawFile(`{"w":{"dtype":"F32","shape":[2]}}`, 8), "lacks"},
		{"negative dim", rawFile(tensor("F32", "[-2]", "[0,8]"), 8), "shape"},
		{"fractional dim", rawFile(tensor("F32", "[2.5]", "[0,8]"), 8), "malformed header entry"},
		{"size mismatch", rawFile(tensor("F32", "[3]", "[0,8]"), 12), "needs 12 bytes"},
		{"offsets outside", rawFile(tensor("F32", "[2]", "[8,16]"), 8), "outside"},
		{"offsets reversed", rawFile(tensor("F32", "[2]", "[8,0]"), 8), "outside"},
		{"negative offset", rawFile(tensor("F32", "[2]", "[-8,0]"), 8), "outside"},
		{"three offsets", rawFile(tensor("F32", "[2]", "[0,8,9]"), 8), "begin, end"},
		{"oversized shape", rawFile(tensor("F32", "[4294967296,4294967296]", "[0,8]"), 8), "larger than the file"},
		{"overflowing shape", rawFile(tensor("F64", "[3037000500,3037000500,2]", "[0,8]"), 8), "larger than the file"},
		{"overlap", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12), "overlap"},
		{"duplicate", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), "twice"},
		{"metadata not strings", rawFile(`{"__metadata__":{"a":1}}`, 0), "__metadata__"},
		{"entry not an object", rawFile(`{"w":7}`, 0), "malformed header entry"},
	}
	for _, tc := range cases {
		_, err := ParseSafetensors(tc.file)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
	// Through OpenSafetensors the file name is part of the message.
	dir := t.TempDir()
	p := filepath.Join(dir, "bad.safetensors")
	if err := os.WriteFile(p, rawFile(tensor("F32", "[2]", "[8,16]"), 8), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenSafetensors(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("OpenSafetensors: %v", err)
	}
}

// FuzzSafetensorsHeader feeds arbitrary images to the parser: it must
// never panic, and whatever it accepts must be addressable and disjoint.
func FuzzSafetensorsHeader(f *testing.F) {
	f.Add(hftest.EncodeSafetensors([]hftest.Tensor{{Name: "a", DType: "F32", Shape: []int64{2, 2}, Vals: []float32{1, 2, 3, 4}}}, map[string]string{"format": "pt"}))
	f.Add(hftest.EncodeSafetensors([]hftest.Tensor{{Name: "x", DType: "BF16", Shape: []int64{3}, Vals: []float32{1, 2, 3}},
		{Name: "y", DType: "F16", Shape: []int64{}, Vals: []float32{5}}}, nil))
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12))
	f.Add(rawFile(`{"__metadata__":{"k":"v"},"t":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, 3))
	if img, err := os.ReadFile(filepath.Join(storiesHF, "model.safetensors")); err == nil {
		f.Add(img[:8+binary.LittleEndian.Uint64(img)+64])
	}
	f.Fuzz(func(t *testing.T, img []byte) {
		sf, err := ParseSafetensors(img)
		if err != nil {
			return
		}
		type span struct{ a, b int64 }
		var spans []span
		for _, ti := range sf.Tensors {
			got, data, err := sf.Tensor(ti.Name)
			if err != nil || got.Size != int64(len(data)) || ti.Offset < 8 || ti.Offset+ti.Size > int64(len(img)) {
				t.Fatalf("accepted tensor %+v is not addressable: %v", ti, err)
			}
			if ti.Size != ti.Elements()*safetensorsDTypes[ti.DType] {
				t.Fatalf("accepted tensor %+v has the wrong size", ti)
			}
			if ti.Size > 0 {
				spans = append(spans, span{ti.Offset, ti.Offset + ti.Size})
			}
		}
		slices.SortFunc(spans, func(x, y span) int { return int(x.a - y.a) })
		for i := 1; i < len(spans); i++ {
			if spans[i].a < spans[i-1].b {
				t.Fatalf("accepted overlapping tensors %v", spans)
			}
		}
	})
}
