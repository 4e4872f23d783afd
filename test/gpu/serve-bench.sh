#!/usr/bin/env bash
# test/gpu/serve-bench.sh BATON OUT: the served figures of test/gpu/run.sh.
#
# Starts the baton binary standalone on the GPU with a dummy model of the
# Qwen3-1.7B shape (test/gpu/models/qwen3-1.7b, f16 weights, the Qwen3
# tokenizer from testdata), runs `baton bench serve` at 1 and 32 streams
# (--input-len 512, --output-len 128), then the same through router +
# prefill + decode on the one GPU (tcp, every prompt handed over), and
# writes each report as JSON to OUT/served-*.json.
#
# MODEL, DEVICE, DTYPE, INPUT_LEN, OUTPUT_LEN, PROMPTS and PD_MEM override the
# defaults (a CPU run of a small config checks the script itself).
set -euo pipefail
BATON=$1
OUT=$2
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-test/gpu/models/qwen3-1.7b/config.json}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-f16}
INPUT_LEN=${INPUT_LEN:-512}
OUTPUT_LEN=${OUTPUT_LEN:-128}
PROMPTS=${PROMPTS:-64}
# Both workers share the one GPU: each takes part of its memory.
PD_MEM=${PD_MEM---mem-fraction-static=0.4}
# The tokenizer is read from a Hugging Face directory: the config beside
# the Qwen3 tokenizer's files.
TOK=$OUT/served-model
mkdir -p "$TOK"
cp "$MODEL" "$TOK/config.json"
for f in tokenizer.json tokenizer_config.json; do ln -sf "$PWD/testdata/tokenizers/qwen3/$f" "$TOK/$f"; done
LOAD=(--model "$MODEL" --load-format dummy --dummy-dtype "$DTYPE" --tokenizer "$TOK"
  --device "$DEVICE" --host 127.0.0.1)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT

# start PORT LOG ARGS...: a baton process in the background.
start() {
  local port=$1 log=$2
  shift 2
  "$BATON" serve --port "$port" "$@" >"$OUT/$log" 2>&1 &
  pids+=($!)
}

# ready PORT: wait (up to 5 minutes: the dummy weights are made at start)
# until the server answers /health with 200, failing at once when one of
# the servers started has exited.
ready() {
  for _ in $(seq 1500); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health")" = 200 ]; then return 0; fi
    for p in "${pids[@]}"; do
      if ! kill -0 "$p" 2>/dev/null; then
        echo "a server exited before port $1 was ready:" >&2
        tail -n 5 "$OUT"/served-*.log >&2
        return 1
      fi
    done
    sleep 0.2
  done
  echo "server on port $1 never became ready" >&2
  return 1
}

# bench NAME PORT CONCURRENCY: one report.
bench() {
  local n=$PROMPTS
  [ "$3" = 1 ] && n=$((PROMPTS < 8 ? PROMPTS : 8))
  "$BATON" bench serve --url "http://127.0.0.1:$2" --concurrency "$3" --num-prompts "$n" \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --temperature 0 --seed 1 --json --progress=false \
    >"$OUT/served-$1-c$3.json"
  echo "served $1 c=$3: $(tr -d '\n' <"$OUT/served-$1-c$3.json" | head -c 400)"
}

stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}

start 18400 served-standalone.log --role standalone "${LOAD[@]}"
ready 18400
bench standalone 18400 1
bench standalone 18400 32
stop_all

start 18410 served-prefill.log --role prefill --grpc-port 18411 "${LOAD[@]}" ${PD_MEM:+"$PD_MEM"}
start 18420 served-decode.log --role decode --grpc-port 18421 --transfer-port 18422 "${LOAD[@]}" ${PD_MEM:+"$PD_MEM"}
ready 18410
ready 18420
start 18430 served-router.log --role router --host 127.0.0.1 --prefill http://127.0.0.1:18410 \
  --decode http://127.0.0.1:18420 --disagg-prefill-threshold 0
ready 18430
bench pd 18430 1
bench pd 18430 32
