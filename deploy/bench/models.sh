#!/usr/bin/env bash
# models.sh: the random-weight GGUFs of the side-by-side tables (make
# bench-peer), written by baton model synth with the Llama 2 vocabulary in
# testdata/vocab: 134m-f32.gguf (768x12, 134M parameters) and 1.1b-f16.gguf
# (TinyLlama 1.1B's shape), and with llama.cpp's llama-quantize (-q) their
# quantised variants 134m-q4_k_m.gguf, 1.1b-q8_0.gguf and 1.1b-q4_k_m.gguf.
# About 3.5 GB in all; a file already there is kept.
#
#   make bench-models DIR=/path/to/models [LLAMA_QUANTIZE=/path/to/llama-quantize]
#   deploy/bench/models.sh [-b BATON] [-q LLAMA_QUANTIZE] [-s SEED] DIR
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
baton=$repo/bin/baton
quantize=
seed=1234
while getopts "b:q:s:" o; do
	case $o in
	b) baton=$OPTARG ;;
	q) quantize=$OPTARG ;;
	s) seed=$OPTARG ;;
	*) echo "usage: deploy/bench/models.sh [-b BATON] [-q LLAMA_QUANTIZE] [-s SEED] DIR" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || { echo "usage: deploy/bench/models.sh [-b BATON] [-q LLAMA_QUANTIZE] [-s SEED] DIR" >&2; exit 2; }
dir=$1
mkdir -p "$dir"
vocab=$repo/testdata/vocab/ggml-vocab-llama-spm.gguf

synth() { # shape file
	if [ -f "$dir/$2" ]; then echo "$dir/$2 is there; kept"; return; fi
	"$baton" model synth --shape "$1" --vocab "$vocab" --seed "$seed" "$dir/$2"
}
synth 134m 134m-f32.gguf
synth 1.1b 1.1b-f16.gguf

if [ -z "$quantize" ]; then
	echo "no LLAMA_QUANTIZE: the Q8_0 and Q4_K_M files are not made (llama.cpp's llama-quantize makes them; deploy/bench/peer.sh says how to build it)"
	exit 0
fi
quant() { # from to type
	if [ -f "$dir/$2" ]; then echo "$dir/$2 is there; kept"; return; fi
	"$quantize" "$dir/$1" "$dir/$2" "$3" >"$dir/$2.log" 2>&1 || { cat "$dir/$2.log" >&2; exit 1; }
	echo "wrote $dir/$2 ($3)"
}
quant 134m-f32.gguf 134m-q4_k_m.gguf Q4_K_M
quant 1.1b-f16.gguf 1.1b-q8_0.gguf Q8_0
quant 1.1b-f16.gguf 1.1b-q4_k_m.gguf Q4_K_M
