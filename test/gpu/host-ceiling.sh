#!/usr/bin/env bash
# test/gpu/host-ceiling.sh [OUT]: the host's side of serving on the cuda
# backend, measured without a GPU.
#
# Runs the baton binary standalone on the emulated CUDA driver with
# FAKE_CUDA_NULL_KERNELS=1: every launch and cuBLAS product does nothing,
# so a step costs only what the host does for it (the engine loop, the
# backend's planning, uploads and launches, HTTP and streaming). The model
# is the dummy Qwen3-1.7B shape test/gpu/serve-bench.sh serves on a GPU,
# the load `baton bench serve` at 1 and 32 streams, 512 tokens in and 128
# out, each after as many warm-up requests as streams (as serve-bench.sh
# does). The figures are the ceiling a GPU's speed cannot lift on this host;
# the text the server returns is not the model's (its outputs are zeros).
#
# BATON (default bin/baton, `make build`), PROMPTS (64) and PORT (18490)
# override the defaults. Reports: OUT/ceiling-c1.json and
# OUT/ceiling-c32.json; one summary line each on stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d)}
BATON=${BATON:-bin/baton}
PROMPTS=${PROMPTS:-64}
PORT=${PORT:-18490}
mkdir -p "$OUT"
go run ./test/gpu/fakebuild "$OUT/fakecuda"
TOK=$OUT/model
mkdir -p "$TOK"
cp test/gpu/models/qwen3-1.7b/config.json "$TOK/config.json"
for f in tokenizer.json tokenizer_config.json; do ln -sf "$PWD/testdata/tokenizers/qwen3/$f" "$TOK/$f"; done

LD_LIBRARY_PATH=$OUT/fakecuda FAKE_CUDA_NULL_KERNELS=1 "$BATON" serve --role standalone --host 127.0.0.1 --port "$PORT" \
  --model "$TOK/config.json" --load-format dummy --dummy-dtype f16 --tokenizer "$TOK" --device cuda \
  --kv-cache-memory 4GiB >"$OUT/ceiling-server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ] && break
  kill -0 "$pid" 2>/dev/null || { tail -n 5 "$OUT/ceiling-server.log" >&2; exit 1; }
  sleep 0.5
done

for c in 1 32; do
  n=$PROMPTS
  [ "$c" = 1 ] && n=8
  "$BATON" bench serve --url "http://127.0.0.1:$PORT" --concurrency "$c" --num-prompts "$n" --warmup-requests "$c" --input-len 512 \
    --output-len 128 --temperature 0 --seed "$((c + 40))" --json --progress=false >"$OUT/ceiling-c$c.json"
  python3 - "$OUT/ceiling-c$c.json" "$c" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"host ceiling c={sys.argv[2]}: {d['output_throughput']:.0f} tok/s out, TPOT p50 {d['tpot_ms']['p50']:.3f} ms, "
      f"ITL p50 {d['itl_ms']['p50']:.3f} ms, TTFT p50 {d['ttft_ms']['p50']:.1f} ms ({d['completed']} requests)")
PY
done
