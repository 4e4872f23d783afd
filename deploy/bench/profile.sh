#!/usr/bin/env bash
# profile.sh: where a standalone baton's CPU time goes while it serves a
# benchmark. It starts `baton serve --role standalone` on MODEL, runs
# `baton bench serve` at STREAMS concurrent streams against it with the
# server under `perf record`, and prints the benchmark's figures, the
# server's CPU seconds and its samples grouped by what they do: matrix
# products, their packing, attention, the small per-row kernels, sampling,
# the thread pool's waits (spinning and the Go scheduler it yields to),
# the OS kernel, and the rest, with the top symbols.
#
#   make bench-profile MODEL=model.gguf [THREADS=2] [STREAMS=32]
#   deploy/bench/profile.sh [-b BATON] [-t THREADS] [-s STREAMS] [-i INPUT_LEN] [-o OUTPUT_LEN]
#                           [-n PROMPTS_PER_STREAM] [-d OUTDIR] MODEL.gguf
#
# The server is started as peer.sh starts it, so the profile is of the
# figures bench-peer reports. BATON_ARGS adds flags to the server. Needs perf (Debian: linux-perf) with
# perf_event_paranoid <= 1 or root; sampling uses the CPU clock, so it works
# in VMs without hardware counters.
set -euo pipefail

usage() {
	cat >&2 <<'USAGE'
usage: deploy/bench/profile.sh [-b BATON] [-t THREADS] [-s STREAMS] [-i INPUT_LEN] [-o OUTPUT_LEN]
                               [-n PROMPTS_PER_STREAM] [-d OUTDIR] MODEL.gguf
USAGE
}

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=deploy/bench/lib.sh
. "$here/lib.sh"
bench_defaults
streams=32
bench_args "$@"
shift $((OPTIND - 1))
model=${1:-}
[ -n "$model" ] && [ -f "$model" ] || { echo "profile.sh: MODEL=$model is not a GGUF file" >&2; usage; exit 2; }
[ -x "$baton" ] || { echo "profile.sh: no baton binary at $baton (make build)" >&2; exit 2; }
command -v perf >/dev/null || { echo "profile.sh: needs perf (Debian: apt-get install linux-perf)" >&2; exit 2; }
needs jq curl
[ -n "$outdir" ] || outdir=$(mktemp -d "${TMPDIR:-/tmp}/baton-profile.XXXXXX")
mkdir -p "$outdir"

port=$((20000 + RANDOM % 20000))
spid=
perfpid=
stop() {
	for p in $perfpid $spid; do
		kill -INT "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	perfpid= spid=
}
trap stop EXIT

# shellcheck disable=SC2086 # BATON_ARGS is a list of flags
"$baton" serve --role standalone --model "$model" --threads "$threads" --host 127.0.0.1 --port "$port" \
	--max-running-requests "$streams" ${BATON_ARGS:-} >"$outdir/baton.log" 2>&1 &
spid=$!
wait_up "$spid" "$port" || { echo "profile.sh: baton did not start:" >&2; tail -5 "$outdir/baton.log" >&2; exit 1; }

ticks=$(getconf CLK_TCK)
cpu_s() { awk -v t="$ticks" '{printf "%.1f", ($14 + $15) / t}' "/proc/$spid/stat"; }
before=$(cpu_s)
perf record -F 499 -p "$spid" -o "$outdir/perf.data" >"$outdir/perf.log" 2>&1 &
perfpid=$!
sleep 0.5
n=$((streams * per))
[ "$n" -lt 4 ] && n=4
"$baton" bench serve --url "http://127.0.0.1:$port" --concurrency "$streams" --num-prompts "$n" --input-len "$in_len" \
	--output-len "$out_len" --seed 7 --json --progress=false >"$outdir/bench.json" 2>"$outdir/bench.err" ||
	{ echo "profile.sh: bench serve failed (see $outdir/bench.err)" >&2; exit 1; }
kill -INT "$perfpid"
wait "$perfpid" 2>/dev/null || true
perfpid=
after=$(cpu_s)

echo "model $model, $threads threads, $streams streams, $n prompts of $in_len tokens, outputs $out_len; files in $outdir"
jq -r '"output \(.output_throughput | . * 10 | round / 10) tok/s in \(.duration_s | . * 10 | round / 10) s; TTFT p50 \(.ttft_ms.p50 | round) ms, ITL p50 \(.itl_ms.p50 * 10 | round / 10) ms"' "$outdir/bench.json"
awk -v b="$before" -v a="$after" -v d="$(jq .duration_s "$outdir/bench.json")" \
	'BEGIN {printf "server CPU %.1f s over the run (%.2f cores busy)\n", a - b, (a - b) / d}'

perf report -i "$outdir/perf.data" --no-children --sort symbol --stdio -g none 2>/dev/null |
	grep -E '^ +[0-9.]+%' >"$outdir/symbols.txt" || true
# Buckets by symbol name (own C kernels, OpenBLAS, the Go runtime).
awk -v cpu="$(awk -v b="$before" -v a="$after" 'BEGIN {print a - b}')" '
function bucket(s, k) {
	if (k == "[k]") return "OS kernel (page faults, syscalls, interrupts)"
	if (s ~ /^(sgemm_kernel|gemm_avx|bk_gemm_avx512|mk16|mk8|qgemm|bk_qgemm|qdot|bk_qdot|gemv|bk_gemv|dotmm|row1_|matmul_scalar)/) return "matrix products (micro-kernels)"
	if (s ~ /^(sgemm_|bk_pack_x|bk_gemm_put|bk_gemm_rows|deq_row|bk_deq|quant_x|bk_quant)/) return "matrix products (packing, dequantising, writing out)"
	if (s ~ /(attention|^chunk_|attn)/) return "attention"
	if (s ~ /(rmsnorm|swiglu|rope|sincos|^add_|f2h|h2f|cvt_row|embed|softcap)/) return "per-row kernels (norm, RoPE, SwiGLU, adds, KV writes)"
	if (s ~ /(sum256|max256|expsum|Sampler|model\.pick|sample)/) return "sampling"
	if (s ~ /(syscall|cgocall|sync\/atomic|cpu\.\(\*job\)|cpu\.\(\*worker\)|cpu\.\(\*pool\)|gosched|goschedImpl|lock2|unlock2|casgstatus|wakep|findRunnable|pidle|runtime\.schedule|runtime\.execute|futex|usleep|osyield|sched_yield|runqget|runqput|globrunq|nanotime)/) return "thread pool waits, cgo calls and Go scheduler"
	if (s ~ /^(runtime\.(mallocgc|memclr|gcBgMark|scanobject|gcDrain|greyobject|findObject|mcache|mcentral|mheap|growslice|memmove)|__mem)/) return "allocation, GC and copies"
	return "other"
}
{
	pct = $1; sub(/%/, "", pct); k = $2; s = $3
	b = bucket(s, k); tot[b] += pct; all += pct
	if (!(b in top) || pct > topv[b]) { top[b] = s; topv[b] = pct }
}
END {
	printf "\n| what | share of samples | core-s | largest symbol |\n| --- | --- | --- | --- |\n"
	n = 0
	for (b in tot) order[++n] = b
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (tot[order[j]] > tot[order[i]]) { t = order[i]; order[i] = order[j]; order[j] = t }
	for (i = 1; i <= n; i++) printf "| %s | %.1f%% | %.1f | %s |\n", order[i], tot[order[i]], cpu * tot[order[i]] / all, top[order[i]]
}' "$outdir/symbols.txt"
echo
echo "top symbols:"
head -15 "$outdir/symbols.txt" | awk '{printf "  %7s  %s\n", $1, $3}'
