#!/usr/bin/env bash
# test/gpu/table.sh OUT: the figures of issue-style GPU tables from the logs
# test/gpu/run.sh left in OUT (bandwidth.log, model.log, served-*.json and
# served-*.kv), each next to the limit computed from what the same run
# measured: the copy bandwidth for decode and the KV handoff, the bf16
# cuBLAS GemmEx peak (8192³) for prefill. Prefill TFLOP/s count 2 a weight a token in the layers, the LM
# head on each prompt's last row and causal attention's Q·Kᵀ and P·V over
# the positions each row sees (prefillFLOPs in gpu_test.go). Prints a
# Markdown table; a figure a step did not produce reads "-".
set -uo pipefail
OUT=$1
# The served runs' TTFT prompt lengths and synth dtypes, as serve-bench.sh
# took them.
TTFT_LENS=${TTFT_LENS-512 4096}
SYNTH_DTYPES=${SYNTH_DTYPES-f16 q8_0 q4_k_m}

# metric LOG PATTERN UNIT: the value before UNIT on the first Benchmark line
# of LOG matching PATTERN.
metric() {
  awk -v pat="$2" -v unit="$3" '$1 ~ /^Benchmark/ && $1 ~ pat { for (i = 2; i <= NF; i++) if ($i == unit) { print $(i-1); exit } }' "$1" 2>/dev/null
}

# served FILE FIELD [STAT]: a number from a `baton bench serve --json` report.
served() {
  [ -f "$1" ] || return 0
  awk -v f="\"$2\"" -v st="\"${3:-}\"" '
    index($0, f ":") { if (st == "\"\"") { v = $2; gsub(/[,]/, "", v); print v; exit } in_ = 1; next }
    in_ && index($0, st ":") { v = $2; gsub(/[,]/, "", v); print v; exit }
    in_ && /}/ { in_ = 0 }' "$1"
}

# kv FILE KEY: a value from serve-bench.sh's served-*.kv.
kv() { [ -f "$1" ] && awk -v k="$2" '$1 == k { print $2; exit }' "$1"; }

fmt() { if [ -n "${1:-}" ]; then printf "%.${2:-0}f" "$1"; else printf -- "-"; fi; }
ratio() { if [ -n "${1:-}" ] && [ -n "${2:-}" ]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; else printf -- "-"; fi; }

copy=$(metric "$OUT/bandwidth.log" 'AttentionDecode' 'copy_GB/s')
# The dummy 1.24B (Llama-3.2-1B shape): 2.48 GB of f16 weights a step, and
# at context 512 its bf16 K/V: 16 layers x 8 heads x 64 dims x 2 x 2 bytes
# a position.
weights=2.48
kvpos=$(awk 'BEGIN { print 16 * 8 * 64 * 2 * 2 / 1e9 }')
limit() { [ -n "$copy" ] && awk -v c="$copy" -v w="$weights" -v k="$kvpos" -v b="$1" 'BEGIN { printf "%.0f", b * c / (w + b * 512 * k) }'; }
d1=$(metric "$OUT/model.log" 'GPUModel1B/decode/batch1/' 'tok/s')
d32=$(metric "$OUT/model.log" 'GPUModel1B/decode/batch32/' 'tok/s')
peak=$(metric "$OUT/bandwidth.log" 'GPUMatMul/peak/bf16-gemmex' 'TFLOP/s')
[ -n "$peak" ] || peak=$(metric "$OUT/bandwidth.log" 'GPUAttentionPrefill/' 'peak_TFLOP/s')
m1=$(metric "$OUT/model.log" 'GPUModelMoE/decode/batch1/' 'tok/s')
m32=$(metric "$OUT/model.log" 'GPUModelMoE/decode/batch32/' 'tok/s')

echo "| work | measured | limit | ratio |"
echo "| --- | --- | --- | --- |"
echo "| copy bandwidth (cuMemcpyDtoD, read + write) | $(fmt "$copy") GB/s | | |"
echo "| decode step, dummy 1.24B f16, batch 1, ctx 512 | $(fmt "$d1") tok/s | $(fmt "$(limit 1)") tok/s | $(ratio "$d1" "$(limit 1)") |"
echo "| same, batch 32 | $(fmt "$d32") tok/s | $(fmt "$(limit 32)") tok/s | $(ratio "$d32" "$(limit 32)") |"
echo "| tensor-core peak (cuBLAS GemmEx, bf16, 8192³) | $(fmt "$peak") TFLOP/s | | |"
for shape in batch1/prompt512 batch1/prompt4096 batch32/prompt128; do
  tok=$(metric "$OUT/model.log" "GPUModel1B/prefill/$shape" 'tok/s')
  tf=$(metric "$OUT/model.log" "GPUModel1B/prefill/$shape" 'TFLOP/s')
  goal=
  [ "$shape" = batch1/prompt512 ] && goal=" (goal 100000 tok/s)"
  b=${shape%%/*}
  p=${shape#*/}
  echo "| prefill, same model, ${b#batch} x ${p#prompt}$goal | $(fmt "$tok") tok/s, $(fmt "$tf" 1) TFLOP/s | peak $(fmt "$peak") TFLOP/s | $(ratio "$tf" "$peak") |"
done
for hd in 64 128 256; do
  a=$(metric "$OUT/bandwidth.log" "GPUAttentionPrefill/bf16/prompt4096/heads32-8/hd$hd" 'attn_TFLOP/s')
  echo "| prefill attention, bf16 KV, 1 x 4096, GQA 32/8, hd $hd (goal 0.5 of peak) | $(fmt "$a" 1) TFLOP/s | peak $(fmt "$peak") TFLOP/s | $(ratio "$a" "$peak") |"
done
echo "| decode step, dummy MoE 2.5B f16 (64 experts, 8 a token), batch 1 / 32, ctx 512 | $(fmt "$m1") / $(fmt "$m32") tok/s | | |"
for dt in bf16 f32; do
  for shape in seqs64/ctx4096 seqs1/ctx32768 seqs1/ctx512; do
    r=$(metric "$OUT/bandwidth.log" "AttentionDecode/$dt/$shape/" 'attn/copy_read')
    g=$(metric "$OUT/bandwidth.log" "AttentionDecode/$dt/$shape/" 'attn_GB/s')
    echo "| paged decode attention, $dt KV, ${shape/\// x }, GQA 32/8, hd 128 | $(fmt "$g") GB/s | read = copy | $(fmt "$r" 2) |"
  done
done
for mode in standalone pd; do
  for c in 1 32; do
    f=$OUT/served-$mode-c$c.json
    echo "| served, dummy Qwen3-1.7B f16, 512 in / 128 out, $mode, $c stream(s) | $(fmt "$(served "$f" output_throughput)") tok/s, TTFT p50 $(fmt "$(served "$f" ttft_ms p50)" 1) ms, ITL p50 $(fmt "$(served "$f" itl_ms p50)" 1) ms | | |"
  done
done
echo "| served, same, pd over cuda-ipc, 32 stream(s) | $(fmt "$(served "$OUT/served-pd-ipc-c32.json" output_throughput)") tok/s, TTFT p50 $(fmt "$(served "$OUT/served-pd-ipc-c32.json" ttft_ms p50)" 1) ms, ITL p50 $(fmt "$(served "$OUT/served-pd-ipc-c32.json" itl_ms p50)" 1) ms | | |"
sa32=$(served "$OUT/served-standalone-c32.json" output_throughput)
for mode in pd pd-ipc; do
  tr=tcp
  goal=
  [ "$mode" = pd-ipc ] && tr=cuda-ipc goal=" (goal >= 0.9)"
  pd32=$(served "$OUT/served-$mode-c32.json" output_throughput)
  echo "| served 32 streams, PD over $tr / standalone$goal | $(fmt "$pd32") / $(fmt "$sa32") tok/s | | $(ratio "$pd32" "$sa32") |"
done
# The handoff of one prompt's KV: B bytes are read and written once, so
# a copy at the measured rate (read + write) takes 2B / copy.
half=
[ -n "$copy" ] && half=$(awk -v c="$copy" 'BEGIN { print c / 2 }')
for mode in pd pd-ipc; do
  tr=tcp
  [ "$mode" = pd-ipc ] && tr=cuda-ipc
  for l in $TTFT_LENS; do
    sa=$(served "$OUT/served-standalone-ttft$l-c1.json" ttft_ms p50)
    pd=$(served "$OUT/served-$mode-ttft$l-c1.json" ttft_ms p50)
    f=$OUT/served-$mode-ttft$l.kv
    bytes=$(kv "$f" bytes)
    secs=$(kv "$f" seconds)
    n=$(kv "$f" handoffs)
    over= per= copyms= viattft= viametrics=
    [ -n "$sa" ] && [ -n "$pd" ] && over=$(awk -v a="$pd" -v b="$sa" 'BEGIN { print a - b }')
    [ -n "$bytes" ] && [ -n "$n" ] && awk -v n="$n" 'BEGIN { exit !(n > 0) }' && per=$(awk -v b="$bytes" -v n="$n" 'BEGIN { print b / n }')
    [ -n "$per" ] && [ -n "$half" ] && copyms=$(awk -v p="$per" -v h="$half" 'BEGIN { print p / (h * 1e9) * 1e3 }')
    [ -n "$per" ] && [ -n "$over" ] && awk -v o="$over" 'BEGIN { exit !(o > 0) }' && viattft=$(awk -v p="$per" -v o="$over" 'BEGIN { print p / (o / 1e3) / 1e9 }')
    [ -n "$bytes" ] && [ -n "$secs" ] && awk -v s="$secs" 'BEGIN { exit !(s > 0) }' && viametrics=$(awk -v b="$bytes" -v s="$secs" 'BEGIN { print b / s / 1e9 }')
    goal=
    [ "$l" = 512 ] && goal=" (goal <= 10 ms)"
    echo "| PD TTFT p50 over standalone, $tr, 1 x $l in, KV auto (bf16 on cuda)$goal | $(fmt "$pd" 1) - $(fmt "$sa" 1) = $(fmt "$over" 1) ms | KV $(fmt "$(awk -v p="${per:-0}" 'BEGIN { if (p > 0) print p / 1e6 }')" 1) MB a prompt, copied in $(fmt "$copyms" 2) ms | $(ratio "$(awk -v o="${over:-0}" 'BEGIN { if (o > 0) print o }')" "$copyms") |"
    echo "| KV handoff, $tr, 1 x $l in: decode's bytes landed / transfer seconds (first page to Commit); a prompt's KV / TTFT overhead | $(fmt "$viametrics" 1) GB/s; $(fmt "$viattft" 1) GB/s | copy / 2: $(fmt "$half") GB/s | $(ratio "$viametrics" "$half") |"
  done
done
echo "| cuda-ipc pages shipped from the device / from host memory (goal: all from the device) | $(fmt "$(kv "$OUT/served-pd-ipc-shipped.kv" device)") / $(fmt "$(kv "$OUT/served-pd-ipc-shipped.kv" host)") | | |"
# synth-1b (TinyLlama 1.1B's shape) reads, a decode step, every matrix
# but the embedding: per layer 31,981,568 values in the Q4_K part of a
# Q4_K_M mix (attn_q, attn_k, attn_output, ffn_gate, ffn_up) and
# 12,058,624 in its Q6_K part (attn_v, ffn_down), x 22 layers, and the
# 65,536,000 of the output (Q6_K): the limit is that many bytes a step at
# the copy bandwidth, c tokens a step (the KV, under 1% at 640 positions,
# left out).
synthgb() {
  awk -v dt="$1" 'BEGIN {
    q4 = 31981568 * 22; q6 = 12058624 * 22 + 65536000
    bpv["f32"] = 4; bpv["f16"] = 2; bpv["bf16"] = 2; bpv["q8_0"] = 34 / 32; bpv["q4_k"] = 144 / 256
    if (dt == "q4_k_m") { printf "%.6f", (q4 * 144 / 256 + q6 * 210 / 256) / 1e9; exit }
    if (dt in bpv) printf "%.6f", (q4 + q6) * bpv[dt] / 1e9 }'
}
for dt in $SYNTH_DTYPES; do
  gb=$(synthgb "$dt")
  for c in 1 32; do
    f=$OUT/served-synth-$dt-c$c.json
    tps=$(served "$f" output_throughput)
    lim=
    [ -n "$copy" ] && [ -n "$gb" ] && lim=$(awk -v c="$copy" -v g="$gb" -v n="$c" 'BEGIN { printf "%.0f", n * c / g }')
    echo "| served, dummy synth-1b (TinyLlama 1.1B shape) $dt, 512 in / 128 out, standalone, $c stream(s) | $(fmt "$tps") tok/s, TTFT p50 $(fmt "$(served "$f" ttft_ms p50)" 1) ms, ITL p50 $(fmt "$(served "$f" itl_ms p50)" 1) ms | $(fmt "$lim") tok/s ($(fmt "$gb" 2) GB a step) | $(ratio "$tps" "$lim") |"
  done
done
