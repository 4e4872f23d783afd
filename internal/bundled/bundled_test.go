package bundled

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/gguf"
)

// The licence note and the loader (baton model inspect, which counts every
// value in the file) agree on the model's size: the file holds 292,800
// values, of which output.weight is a copy of the token embedding (the
// model was trained with the two tied, llama2.c's converter writes both),
// leaving 260,032 distinct parameters, norms included. Before, the note
// gave only the second number and the loader only the first.
func TestParameterCounts(t *testing.T) {
	f, err := gguf.Parse(Stories260K)
	if err != nil {
		t.Fatal(err)
	}
	var all, output, embed int64
	for _, ti := range f.Tensors {
		all += ti.Elements()
		switch ti.Name {
		case "output.weight":
			output = ti.Elements()
		case "token_embd.weight":
			embed = ti.Elements()
		}
	}
	if all != 292800 || output != 32768 || embed != output || all-output != 260032 {
		t.Fatalf("%d values, output.weight %d, token_embd.weight %d", all, output, embed)
	}
	_, ob, err := f.Tensor("output.weight")
	if err != nil {
		t.Fatal(err)
	}
	_, eb, err := f.Tensor("token_embd.weight")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ob, eb) {
		t.Fatal("output.weight is not a copy of token_embd.weight")
	}
	note, err := os.ReadFile("LICENSE.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"292,800 values", "260,032 distinct parameters", "`output.weight`"} {
		if !strings.Contains(strings.Join(strings.Fields(string(note)), " "), want) {
			t.Errorf("LICENSE.md does not say %q", want)
		}
	}
}
