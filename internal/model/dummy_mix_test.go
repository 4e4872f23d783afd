package model

import (
	"bytes"
	"math"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/model/hftest"
)

// A llama config.json loads as dummy weights in Q4_K (every matrix) and
// in the Q4_K_M mix (attn_v, ffn_down and the untied output in Q6_K), the
// dtypes --dummy-dtype q4_k and q4_k_m ask for: each tensor has its
// kind's dtype and the model's logits are finite.
func TestDummyKFormats(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.json")
	hftest.WriteJSON(t, path, map[string]any{"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
		"rope_theta": 10000, "tie_word_embeddings": false, "hidden_act": "silu"})
	kind := regexp.MustCompile(`^(?:blk\.\d+\.)?([a-z_]+)\.weight$`)
	for _, tc := range []struct {
		name string
		o    LoadOptions
		want func(kind string) kernels.DType
	}{
		{"q4_k", LoadOptions{DummyDType: kernels.Q4_K}, func(string) kernels.DType { return kernels.Q4_K }},
		{"q4_k_m", LoadOptions{DummyPick: Q4KM}, func(k string) kernels.DType {
			if k == "attn_v" || k == "ffn_down" || k == "output" {
				return kernels.Q6_K
			}
			return kernels.Q4_K
		}},
	} {
		tc.o.Path, tc.o.Format = path, "dummy"
		l, err := Load(tc.o, cpu.New(2))
		if err != nil {
			t.Fatal(tc.name, err)
		}
		seen := map[kernels.DType]int{}
		l.Model.Weights.eachMatrix(func(name string, m *kernels.Matrix) {
			k := kind.FindStringSubmatch(name)
			if k == nil {
				t.Fatalf("%s: unexpected tensor %s", tc.name, name)
			}
			if m.DType != tc.want(k[1]) {
				t.Errorf("%s: %s is %s, want %s", tc.name, name, m.DType, tc.want(k[1]))
			}
			seen[m.DType]++
		})
		if tc.name == "q4_k_m" && (seen[kernels.Q6_K] != 5 || seen[kernels.Q4_K] != 11) {
			t.Errorf("q4_k_m: %v matrices by dtype, want 5 Q6_K and 11 Q4_K", seen)
		}
		for _, v := range lastLogits(t, l.Model, []int32{1, 2, 3}) {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%s: logit %v", tc.name, v)
			}
		}
		l.Model.Close()
	}
}

// The mix made directly holds the bytes Requantize makes from the same
// values in f32 (Requantize's rows shared out among goroutines, the
// dummy's matrices among goroutines too): one encoding either way.
func TestDummyMixedEqualsRequantized(t *testing.T) {
	c := quantConfig
	c.Vocab = 1000 // rows that do not split evenly into Requantize's spans
	direct, err := DummyWeightsMixed(&c, Q4KM)
	if err != nil {
		t.Fatal(err)
	}
	via, err := DummyWeights(&c, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	via.Requantize(Q4KM)
	var names []string
	var ms []*kernels.Matrix
	direct.eachMatrix(func(name string, m *kernels.Matrix) { names, ms = append(names, name), append(ms, m) })
	i := 0
	via.eachMatrix(func(name string, m *kernels.Matrix) {
		if m.DType != ms[i].DType || !bytes.Equal(m.Data, ms[i].Data) {
			t.Errorf("%s: requantized %s differs from the dummy %s", name, m.DType, ms[i].DType)
		}
		i++
	})
}
