package main

import (
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/model"
)

// --dummy-dtype's help names every dtype the flag takes. Before, it left
// out bf16, which parseDType (and the README's flag table) accept.
func TestDummyDTypeHelp(t *testing.T) {
	usage := serveCmd().Flags().Lookup("dummy-dtype").Usage
	for _, dt := range []string{"f32", "f16", "bf16", "q8_0", "q4_k", "q4_k_m"} {
		if _, err := parseDType(dt); err != nil {
			t.Fatalf("%s: %v", dt, err)
		}
		if !strings.Contains(usage, dt) {
			t.Errorf("--dummy-dtype help %q does not name %s", usage, dt)
		}
	}
}

// q4_k puts every matrix in Q4_K; q4_k_m picks Q6_K for attn_v, ffn_down
// and the output, Q4_K for the rest, as llama.cpp's Q4_K_M does.
func TestDummyDTypeKFormats(t *testing.T) {
	d, err := parseDType("q4_k")
	if err != nil || d.dt != kernels.Q4_K || d.pick != nil {
		t.Fatalf("q4_k: %+v %v", d, err)
	}
	d, err = parseDType("Q4_K_M")
	if err != nil || d.pick == nil {
		t.Fatalf("q4_k_m: %+v %v", d, err)
	}
	for kind, want := range map[string]kernels.DType{"attn_q": kernels.Q4_K, "attn_k": kernels.Q4_K, "attn_v": kernels.Q6_K,
		"attn_output": kernels.Q4_K, "ffn_gate": kernels.Q4_K, "ffn_up": kernels.Q4_K, "ffn_down": kernels.Q6_K,
		"token_embd": kernels.Q4_K, "output": kernels.Q6_K} {
		if got := d.pick(kind); got != want {
			t.Errorf("q4_k_m: %s in %s, want %s", kind, got, want)
		}
	}
	if o := d.loadOptions(model.LoadOptions{}); o.DummyPick == nil || o.DummyDType != kernels.Q4_K {
		t.Errorf("q4_k_m load options: %+v", o)
	}
}
