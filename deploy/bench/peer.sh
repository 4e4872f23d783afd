#!/usr/bin/env bash
# peer.sh: baton next to llama.cpp's llama-server on the same GGUF, the same
# threads and the same client (baton bench serve), both servers up and
# taking turns (at each number of streams, in each of ROUNDS rounds), and
# one table of output tokens/s, TTFT and ITL with the ratio baton /
# llama-server per number of streams.
#
#   make bench-peer LLAMA_SERVER=/path/to/llama-server MODEL=model.gguf
#   (the tables' random-weight models: make bench-models DIR=..., deploy/bench/models.sh)
#   deploy/bench/peer.sh [-b BATON] [-t THREADS] [-s "1 8 32"] [-i INPUT_LEN] [-o OUTPUT_LEN]
#                        [-n PROMPTS_PER_STREAM] [-r ROUNDS] [-d OUTDIR] LLAMA_SERVER MODEL.gguf
#
# LLAMA_ARGS and BATON_ARGS add flags to either server (e.g. LLAMA_ARGS="--poll 0"
# on a machine shared with other work, where llama.cpp's spinning threads
# lose their time slices). Machines shared with other work give noisy
# figures: compare only the ratios of one run.
set -euo pipefail

usage() {
	cat >&2 <<'USAGE'
usage: deploy/bench/peer.sh [-b BATON] [-t THREADS] [-s "1 8 32"] [-i INPUT_LEN] [-o OUTPUT_LEN]
                            [-n PROMPTS_PER_STREAM] [-r ROUNDS] [-d OUTDIR] LLAMA_SERVER MODEL.gguf
USAGE
}

no_llama() {
	cat >&2 <<'HOWTO'
bench-peer needs llama.cpp's llama-server (LLAMA_SERVER=/path/to/llama-server).

The figures in this project's notes come from llama.cpp at commit 0253fb2 (ggml 0.12.0),
built for the CPU with native flags and OpenMP, no BLAS:

    git clone https://github.com/ggml-org/llama.cpp && cd llama.cpp
    git checkout 0253fb21f595246f54c192fe8332f34173be251b
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_OPENMP=ON
    cmake --build build -j"$(nproc)" --target llama-server llama-quantize

then: make bench-peer LLAMA_SERVER=$PWD/build/bin/llama-server MODEL=/path/to/model.gguf
(build/bin/llama-quantize model-f32.gguf model-q4_k_m.gguf Q4_K_M makes quantised variants.)
The random-weight models of the project's tables: make bench-models DIR=... LLAMA_QUANTIZE=$PWD/build/bin/llama-quantize
HOWTO
	exit 2
}

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=deploy/bench/lib.sh
. "$here/lib.sh"
bench_defaults
streams="1 8 32"
bench_args "$@"
shift $((OPTIND - 1))
llama=${1:-}
model=${2:-}
[ -n "$llama" ] || no_llama
[ -x "$llama" ] || { echo "peer.sh: $llama is not an executable llama-server" >&2; no_llama; }
[ -n "$model" ] && [ -f "$model" ] || { echo "peer.sh: MODEL=$model is not a GGUF file" >&2; usage; exit 2; }
[ -x "$baton" ] || { echo "peer.sh: no baton binary at $baton (make build)" >&2; exit 2; }
needs jq curl
[ -n "$outdir" ] || outdir=$(mktemp -d "${TMPDIR:-/tmp}/baton-peer.XXXXXX")
mkdir -p "$outdir"

maxs=0
for s in $streams; do [ "$s" -gt "$maxs" ] && maxs=$s; done
ctx=$((maxs * (in_len + out_len + 64)))
[ "$ctx" -lt 4096 ] && ctx=4096
lport=$((20000 + RANDOM % 20000))
bport=$((lport + 1))

lpid=
bpid=
stop() {
	for p in $lpid $bpid; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	lpid= bpid=
}
trap stop EXIT

# bench NAME PORT STREAMS ROUND: one baton bench serve run, its JSON report
# kept. Each number of streams in each round has prompts of its own (the
# seed), the same for both servers: repeated, they would be served from
# either server's prompt cache.
bench() {
	local n=$(($3 * per))
	[ "$n" -lt 4 ] && n=4
	"$baton" bench serve --url "http://127.0.0.1:$2" --concurrency "$3" --num-prompts "$n" --input-len "$in_len" \
		--output-len "$out_len" --seed $((7 + 1000 * $4 + $3)) --json --progress=false --allow-failures >"$outdir/$1-s$3-r$4.json" 2>"$outdir/$1-s$3-r$4.err" ||
		echo "peer.sh: $1 at $3 streams, round $4 failed (see $outdir/$1-s$3-r$4.err)" >&2
}

echo "model $model, $threads threads, streams: $streams, prompts $in_len tokens, outputs $out_len, $rounds round(s); logs in $outdir" >&2
echo "load average now: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores" >&2
# Both servers stay up and take turns, llama-server then baton at each
# number of streams in each round: on a machine shared with other work the
# load drifts over minutes, and one server's whole run after the other's
# put that drift into the ratio. A server waiting for requests uses no CPU.
# shellcheck disable=SC2086 # LLAMA_ARGS and BATON_ARGS are word lists
"$llama" -m "$model" -t "$threads" -tb "$threads" -c "$ctx" -np "$maxs" --host 127.0.0.1 --port "$lport" \
	${LLAMA_ARGS:-} >"$outdir/llama-server.log" 2>&1 &
lpid=$!
wait_up "$lpid" "$lport" || { echo "peer.sh: llama-server did not start:" >&2; tail -5 "$outdir/llama-server.log" >&2; exit 1; }
# shellcheck disable=SC2086
"$baton" serve --role standalone --model "$model" --threads "$threads" --host 127.0.0.1 --port "$bport" \
	--max-running-requests "$maxs" ${BATON_ARGS:-} >"$outdir/baton.log" 2>&1 &
bpid=$!
wait_up "$bpid" "$bport" || { echo "peer.sh: baton did not start:" >&2; tail -5 "$outdir/baton.log" >&2; exit 1; }
for r in $(seq 1 "$rounds"); do
	for s in $streams; do
		bench llama "$lport" "$s" "$r"
		bench baton "$bport" "$s" "$r"
	done
done
stop

# Each server's rounds at one number of streams in one report: output
# tok/s is all rounds' tokens over all their time, the failures and the
# tokens failed streams delivered are summed, and TTFT and ITL are the
# median of the p50s of the rounds where a request completed (a round
# whose requests all failed reports 0).
for name in llama baton; do
	for s in $streams; do
		jq -s 'def median: sort | length as $n | if $n == 0 then null elif $n % 2 == 1 then .[($n - 1) / 2] else (.[$n / 2 - 1] + .[$n / 2]) / 2 end;
		{
			output_throughput: ((map(.total_output_tokens // 0) | add) / ((map(.duration_s // 0) | add) + 1e-9)),
			duration_s: (map(.duration_s // 0) | add),
			failed: (map(.failed // 0) | add),
			failed_streamed_chunks: (map(.failed_streamed_chunks // 0) | add),
			ttft_ms: {p50: (map(select((.completed // 0) > 0) | .ttft_ms.p50 // empty) | median)},
			itl_ms: {p50: (map(select((.completed // 0) > 0) | .itl_ms.p50 // empty) | median)}
		}' "$outdir/$name-s$s"-r*.json >"$outdir/$name-s$s.json" 2>/dev/null || rm -f "$outdir/$name-s$s.json"
	done
done

field() { jq -r "$2 // empty" "$outdir/$1.json" 2>/dev/null || true; }
# A request that fails is left out of its server's tok/s (the client got no
# answer) but its time is not. llama-server on random-weight models ends
# some streams with an error event ("Failed to parse input"), some after
# every token, some a few tokens in, so the table also gives the ratio to
# llama's tok/s with the tokens its failed streams delivered added back
# ("l+failed": failed_streamed_chunks, one token per chunk). A connection
# closed before an answer delivered none.
printf '| %-7s | %-10s | %-10s | %-6s | %-14s | %-8s | %-19s | %-19s |\n' streams "llama tok/s" "baton tok/s" ratio "failed (l / b)" "ratio to l+failed" "TTFT p50 ms (l / b)" "ITL p50 ms (l / b)"
printf '|---------|------------|------------|--------|----------------|-------------------|---------------------|---------------------|\n'
for s in $streams; do
	lt=$(field llama-s$s .output_throughput)
	bt=$(field baton-s$s .output_throughput)
	lf=$(field llama-s$s .failed)
	lx=$(field llama-s$s .failed_streamed_chunks)
	ld=$(field llama-s$s .duration_s)
	bf=$(field baton-s$s .failed)
	ratio=$(awk -v a="${lt:-0}" -v b="${bt:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", b / a; else print "-" }')
	fair=$(awk -v a="${lt:-0}" -v b="${bt:-0}" -v x="${lx:-0}" -v d="${ld:-0}" 'BEGIN { if (a > 0 && b > 0 && d > 0) printf "%.2f", b / (a + x / d); else print "-" }')
	ttft=$(printf '%.0f / %.0f' "$(field llama-s$s .ttft_ms.p50)" "$(field baton-s$s .ttft_ms.p50)" 2>/dev/null || echo -)
	itl=$(printf '%.1f / %.1f' "$(field llama-s$s .itl_ms.p50)" "$(field baton-s$s .itl_ms.p50)" 2>/dev/null || echo -)
	printf '| %-7s | %-10.1f | %-10.1f | %-6s | %-14s | %-17s | %-19s | %-19s |\n' "$s" "${lt:-0}" "${bt:-0}" "$ratio" "${lf:-0} / ${bf:-0}" "$fair" "$ttft" "$itl"
done
