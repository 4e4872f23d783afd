#!/usr/bin/env bash
# greedy.sh: baton's greedy tokens next to llama.cpp's llama-server's on the
# same GGUF: five prompts, N tokens each, both servers with f32 KV. For
# each prompt, how many leading tokens agree and, where they part, how far
# apart each server's top two candidates were there (a near tie, which
# rounding decides either way, or a real difference).
#
#   deploy/bench/greedy.sh [-b BATON] [-t THREADS] [-o N] LLAMA_SERVER MODEL.gguf
set -euo pipefail
usage() { echo "usage: deploy/bench/greedy.sh [-b BATON] [-t THREADS] [-o N] LLAMA_SERVER MODEL.gguf" >&2; }
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=deploy/bench/lib.sh
. "$here/lib.sh"
bench_defaults
out_len=24
bench_args "$@"
shift $((OPTIND - 1))
[ $# -eq 2 ] || { usage; exit 2; }
llama=$1 model=$2
needs jq curl
lport=9311 bport=9312
"$llama" -m "$model" --port $lport -t "$threads" -c 512 -ctk f32 -ctv f32 >/dev/null 2>&1 &
lpid=$!
"$baton" serve --model "$model" --port $bport --threads "$threads" --kv-cache-dtype f32 >/dev/null 2>&1 &
bpid=$!
trap 'kill $lpid $bpid 2>/dev/null; wait 2>/dev/null' EXIT
wait_up $lpid $lport || { echo "greedy.sh: llama-server did not come up" >&2; exit 1; }
wait_up $bpid $bport || { echo "greedy.sh: baton did not come up" >&2; exit 1; }
same=0
for p in "Once upon a time" "The capital of France is" "def fibonacci(n):" "In 1492, Columbus" "The quick brown fox"; do
	b=$(curl -fsS "http://127.0.0.1:$bport/v1/completions" -H 'Content-Type: application/json' \
		-d "$(jq -nc --arg p "$p" --argjson n "$out_len" '{prompt:$p,max_tokens:$n,temperature:0,ignore_eos:true,logprobs:2}')")
	l=$(curl -sS "http://127.0.0.1:$lport/completion" \
		-d "$(jq -nc --arg p "$p" --argjson n "$out_len" '{prompt:$p,n_predict:$n,temperature:0,top_k:1,n_probs:2,cache_prompt:false,ignore_eos:true}')")
	if ! jq -e .completion_probabilities >/dev/null <<<"$l"; then
		# llama-server refuses to return output that is not valid UTF-8 and
		# puts the text in its error instead: compare the text.
		if [ "$(jq -r '.error.message | sub("^[^:]*: "; "")' <<<"$l")" = "$(jq -r '.choices[0].text' <<<"$b")" ]; then
			echo "$p: the same text (llama-server gave no tokens: not valid UTF-8)"; same=$((same + 1))
		else
			echo "$p: llama-server gave no tokens, and its text differs"
		fi
		continue
	fi
	jq -nr --arg p "$p" --argjson b "$b" --argjson l "$l" '
		($l.completion_probabilities | map(.token)) as $lt | ($b.choices[0].logprobs.tokens) as $bt |
		([range(0; $lt | length) | select($lt[.] != $bt[.])] | first // ($lt | length)) as $k |
		if $k == ($lt | length) then "\($p): all \($k) tokens the same"
		else ($l.completion_probabilities[$k].top_logprobs | .[0].logprob - .[1].logprob) as $lm |
		     ($b.choices[0].logprobs.top_logprobs[$k] | [.[]] | sort | reverse | .[0] - .[1]) as $bm |
		     "\($p): the same for \($k) tokens, then \($lt[$k] | @json) / \($bt[$k] | @json); top two apart by \($lm) (llama.cpp), \($bm) (baton)" end'
	[ "$(jq -c '.completion_probabilities | map(.token)' <<<"$l")" = "$(jq -c '.choices[0].logprobs.tokens' <<<"$b")" ] && same=$((same + 1))
done
echo "$(basename "$model"): $same of 5 prompts the same"
