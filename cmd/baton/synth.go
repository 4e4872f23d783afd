package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/batonlm/baton/internal/model/synth"
)

func modelSynthCmd() *cobra.Command {
	var shape, dtype, vocab, name string
	var seed uint64
	var std float64
	var s synth.Shape
	var names []string
	for n := range synth.Shapes {
		names = append(names, n)
	}
	slices.Sort(names)
	cmd := &cobra.Command{
		Use:   "synth --shape 134m|1.1b|moe-2.5b OUT.gguf",
		Short: "Write a Llama GGUF of a real shape with random weights, for speed tests",
		Long: `Writes a Llama GGUF with random normal weights (norms of ones) of a real model's shape:
the models the side-by-side tables next to llama.cpp use (make bench-peer). Their output is
noise; their sizes, bytes moved and FLOPs are the real model's. The same shape, seed and
vocabulary give the same file.

  134m   hidden 768, 12 layers, 12 heads, ffn 2048, vocab 32000, F32 (134M parameters)
  1.1b   TinyLlama 1.1B's shape: hidden 2048, 22 layers, 32 heads, 4 kv heads, ffn 5632, vocab 32000, F16
  moe-2.5b  a Qwen3-MoE (qwen3moe): hidden 1024, 24 layers, 16 heads, 4 kv heads, 64 experts of
         ffn 512 with 8 used a token, vocab 32000, F16 (2.5B parameters, 0.4B read a token)

--hidden, --layers, --heads, --kv-heads, --ffn, --vocab-size, --context, --dtype, --arch,
--experts and --experts-used change a shape (or give one whole without --shape); --experts
makes a mixture of experts, Mixtral-style (llama) unless --arch qwen3moe. The tokenizer is --vocab's (any GGUF with
tokenizer.* metadata; the benchmark tables used llama.cpp's Llama 2 vocabulary,
testdata/vocab/ggml-vocab-llama-spm.gguf), else the bundled model's, padded with unused
pieces up to the shape's vocabulary. Quantised variants (Q8_0, Q4_K_M, ...) are made from
the F32/F16 file by llama.cpp's llama-quantize:

  llama-quantize 1.1b-f16.gguf 1.1b-q4_k_m.gguf Q4_K_M

make bench-models DIR=... writes the files of the benchmark tables.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if shape != "" {
				base, ok := synth.Shapes[strings.ToLower(shape)]
				if !ok {
					return fmt.Errorf("--shape %q: one of %s", shape, strings.Join(names, ", "))
				}
				// A flag given on the command line changes that one size.
				fs := cmd.Flags()
				for _, o := range []struct {
					flag     string
					dst, src *int
				}{{"hidden", &s.Dim, &base.Dim}, {"layers", &s.Layers, &base.Layers}, {"heads", &s.Heads, &base.Heads},
					{"kv-heads", &s.KVHeads, &base.KVHeads}, {"ffn", &s.FF, &base.FF}, {"vocab-size", &s.Vocab, &base.Vocab},
					{"context", &s.Context, &base.Context}, {"experts", &s.Experts, &base.Experts}, {"experts-used", &s.ExpertsUsed, &base.ExpertsUsed}} {
					if !fs.Changed(o.flag) {
						*o.dst = *o.src
					}
				}
				if dtype == "" {
					dtype = base.DType
				}
				if !fs.Changed("arch") {
					s.Arch = base.Arch
				}
			}
			if s.KVHeads == 0 {
				s.KVHeads = s.Heads
			}
			if dtype == "" {
				dtype = "F32"
			}
			s.DType = dtype
			if err := synth.Write(args[0], s, synth.Options{Seed: seed, Std: std, Vocab: vocab, Name: name}); err != nil {
				return err
			}
			st, err := os.Stat(args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: hidden %d, layers %d, heads %d/%d, ffn %d, %s, seed %d, %.2f GB\n",
				args[0], s.Dim, s.Layers, s.Heads, s.KVHeads, s.FF, strings.ToUpper(s.DType), seed, float64(st.Size())/1e9)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&shape, "shape", "", "a benchmark shape: "+strings.Join(names, ", "))
	f.IntVar(&s.Dim, "hidden", 0, "hidden size")
	f.IntVar(&s.Layers, "layers", 0, "layers")
	f.IntVar(&s.Heads, "heads", 0, "attention heads")
	f.IntVar(&s.KVHeads, "kv-heads", 0, "key/value heads (default: --heads)")
	f.IntVar(&s.FF, "ffn", 0, "feed-forward size")
	f.IntVar(&s.Vocab, "vocab-size", 0, "vocabulary size (the tokenizer is padded up to it)")
	f.IntVar(&s.Context, "context", 2048, "context length")
	f.StringVar(&s.Arch, "arch", "", "architecture: llama (default) or qwen3moe")
	f.IntVar(&s.Experts, "experts", 0, "experts of a mixture of experts (0: a dense model)")
	f.IntVar(&s.ExpertsUsed, "experts-used", 0, "experts a token runs")
	f.StringVar(&dtype, "dtype", "", "weight dtype: f32, f16 or bf16 (default: the shape's)")
	f.StringVar(&vocab, "vocab", "", "GGUF whose tokenizer.* metadata the model takes (default: the bundled model's)")
	f.StringVar(&name, "name", "", "general.name (default: OUT's base name)")
	f.Uint64Var(&seed, "seed", 1234, "random seed")
	f.Float64Var(&std, "std", 0.02, "standard deviation of the weights")
	return cmd
}
