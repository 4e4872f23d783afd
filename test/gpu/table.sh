#!/usr/bin/env bash
# test/gpu/table.sh OUT: the figures of issue-style GPU tables from the logs
# test/gpu/run.sh left in OUT (bandwidth.log, model.log, served-*.json),
# each next to the limit computed from what the same run measured: the
# copy bandwidth for decode, the bf16 cuBLAS GemmEx peak (8192³) for
# prefill. Prefill TFLOP/s count 2 a weight a token in the layers, the LM
# head on each prompt's last row and causal attention's Q·Kᵀ and P·V over
# the positions each row sees (prefillFLOPs in gpu_test.go). Prints a
# Markdown table; a figure a step did not produce reads "-".
set -uo pipefail
OUT=$1

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
