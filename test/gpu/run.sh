#!/usr/bin/env bash
# test/gpu/run.sh: the GPU checks of the CUDA backend, on a machine with an
# NVIDIA GPU (driver for CUDA 11.8 or newer), in under 8 minutes.
#
# It needs no Go and no CUDA toolkit: build the binaries on a machine with Go
# first (`make gpu-test-bins` -> test/gpu/bin/, test/gpu/lib/ and both packed
# in test/gpu/kit.tar.xz) and carry test/gpu/kit.tar.xz (or test/gpu/bin and
# test/gpu/lib) along with the working tree: it unpacks the kit when bin/ is
# missing. cuBLAS is found as libcublas.so.12/.13/.11 on the
# loader's path or in /usr/local/cuda/lib64 (without it products run on the
# backend's own kernels, and the log says so). The baton binary also links
# OpenBLAS: libopenblas.so.0, libgfortran.so.5 and libquadmath.so.0 from the
# build machine are in test/gpu/lib, put on LD_LIBRARY_PATH after the
# machine's own. The served step needs curl.
#
# Steps (each with a time limit; logs and a summary go to $OUT, default a
# new temporary directory). The times are estimates for an H200 (the
# served step's additions have not yet run on one); the limits bound them:
#   1. device      the driver, GPU and cuBLAS the backend finds (~5 s)
#   2. kernels     parity of every kernel with the reference on random inputs
#                  (tolerances in internal/kernels/cuda/parity_test.go), the
#                  stories260K greedy reference, dummy models of every dtype
#                  (~1-2 min)
#   3. bandwidth   paged decode attention GB/s against cuMemcpyDtoD, the
#                  gemv / cuBLAS products in GB/s of weights, the bf16
#                  cuBLAS GemmEx peak (8192³, TFLOP/s) and prompt attention
#                  on the tensor cores at 4096 tokens in TFLOP/s (~1 min)
#   4. model       dummy 1B and MoE 2.5B (f16) prefill and decode tokens/s,
#                  batch 1 and 32; the 1B's prefill at 1 x 512, 1 x 4096
#                  and 32 x 128 also in TFLOP/s (~1-2 min)
#   5. serve       the baton binary as router + prefill + decode with
#                  --device cuda on loopback: KV pools in GPU memory, pages
#                  over tcp through pinned buffers and GPU to GPU over
#                  cuda-ipc (every page shipped from the device; once in
#                  fp8 KV), the greedy reference; a cuda prefill (bf16 KV)
#                  paired with a cpu decode (~40 s)
#   6. served      `baton bench serve` against the binary on the GPU
#                  (test/gpu/serve-bench.sh, ~2 min: six server starts of a
#                  few seconds each, every run a few seconds):
#                  - dummy Qwen3-1.7B shape (test/gpu/models), 512 in / 128
#                    out at 1 stream (8 prompts) and 32 (32 prompts), and
#                    TTFT runs of 5 prompts at 512 and 4096 in, 8 out:
#                    standalone, then router + prefill + decode over tcp,
#                    then over cuda-ipc (32 streams and the TTFT runs): PD
#                    TTFT over standalone (goal <= 10 ms at 512), the
#                    handoff's GB/s from decode's /metrics against the copy
#                    bandwidth, 32-stream PD throughput over standalone's
#                    (goal >= 0.9 over cuda-ipc)
#                  - dummy synth-1b (TinyLlama 1.1B shape, test/gpu/models)
#                    standalone in F16, Q8_0 and Q4_K_M (--dummy-dtype
#                    q4_k_m), 512 in / 128 out at 1 and 32 streams
# It ends with the table of figures against the limits the measured copy
# bandwidth and GemmEx peak set (test/gpu/table.sh), in $OUT/summary.txt.
#
# Exit status: 0 when every step passed; the GPU tests must not skip here.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BIN=$ROOT/test/gpu/bin
OUT=${OUT:-$(mktemp -d /tmp/baton-gpu.XXXXXX)}
mkdir -p "$OUT"
if [ ! -d "$BIN" ] && [ -f "$ROOT/test/gpu/kit.tar.xz" ]; then
  xz -dc "$ROOT/test/gpu/kit.tar.xz" | tar -C "$ROOT/test/gpu" -xf -
fi
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64:$ROOT/test/gpu/lib"
# The GPU tests fail, rather than skip, when the GPU cannot be opened.
export BATON_REQUIRE_GPU=1

for f in baton cuda.test gpu.test e2e.test; do
  if [ ! -x "$BIN/$f" ]; then
    echo "missing $BIN/$f: run 'make gpu-test-bins' on a machine with Go and carry test/gpu/bin" >&2
    exit 2
  fi
done

failed=()
# step NAME LIMIT_SECONDS DIR COMMAND...: run COMMAND in DIR, log to $OUT/NAME.log.
step() {
  local name=$1 limit=$2 dir=$3
  shift 3
  echo "=== $name (limit ${limit}s)"
  local t0=$SECONDS
  (cd "$dir" && timeout --kill-after=10 "$limit" "$@") >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -E '^(---|ok|FAIL|PASS|Benchmark|panic)|worst|tokens match|Describe|device|dummy |GB/s|tok/s' "$OUT/$name.log" | grep -v '^=== RUN' | tail -n 60
  if grep -q -- '--- SKIP: \(TestGPU\|BenchmarkGPU\)' "$OUT/$name.log"; then
    echo "!!! $name: GPU tests skipped on the GPU machine:"
    grep -A1 -- '--- SKIP' "$OUT/$name.log" | head -n 4
    rc=1
  fi
  echo "=== $name: rc=$rc in $((SECONDS - t0))s"
  [ $rc -eq 0 ] || failed+=("$name")
}

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$OUT/nvidia-smi.log" 2>&1
  cat "$OUT/nvidia-smi.log"
fi
if [ -x "$BIN/baton" ]; then
  timeout 30 "$BIN/baton" env >"$OUT/env.log" 2>&1 || echo "(baton env failed: see $OUT/env.log)"
fi

step device 60 "$ROOT/internal/kernels/cuda" "$BIN/cuda.test" -test.run '^(TestOpenHere|TestFatbinStamp)$' -test.v
step kernels 240 "$ROOT/internal/kernels/cuda" "$BIN/cuda.test" -test.run '^TestGPU' -test.v -test.timeout 230s
step bandwidth 120 "$ROOT/internal/kernels/cuda" "$BIN/cuda.test" -test.run '^$' -test.bench 'GPU' -test.benchtime 20x -test.v -test.timeout 110s
step model 240 "$ROOT/test/gpu" "$BIN/gpu.test" -test.run '^$' -test.bench 'GPUModel' -test.benchtime 3x -test.v -test.timeout 230s
step serve 120 "$ROOT/test/e2e" env BATON_TEST_BINARY="$BIN/baton" "$BIN/e2e.test" -test.run '^(TestPDOnCUDA|TestPDOverCUDAIPC|TestPDOverCUDAIPCFP8|TestPDCUDAPrefillHalfKV)$' -test.v -test.timeout 110s
step served 240 "$ROOT" env PROMPTS=32 test/gpu/serve-bench.sh "$BIN/baton" "$OUT"

{
  echo "baton GPU run $(date -u +%FT%TZ)"
  cat "$OUT/nvidia-smi.log" 2>/dev/null
  grep -h -E 'TestOpenHere|open_test' "$OUT/device.log"
  grep -h -E '^(--- (PASS|FAIL|SKIP)|ok|FAIL)' "$OUT/kernels.log" "$OUT/serve.log"
  grep -h -E 'worst|tokens match' "$OUT/kernels.log"
  grep -h -E '^Benchmark' "$OUT/bandwidth.log" "$OUT/model.log"
  grep -h 'dummy ' "$OUT/model.log"
  echo
  bash "$ROOT/test/gpu/table.sh" "$OUT"
  echo
  if [ ${#failed[@]} -eq 0 ]; then echo "ALL PASSED"; else echo "FAILED: ${failed[*]}"; fi
} >"$OUT/summary.txt"
echo
cat "$OUT/summary.txt"
echo "logs: $OUT"
[ ${#failed[@]} -eq 0 ]
