#!/usr/bin/env bash
# test/gpu/serve-bench.sh BATON OUT: the served figures of test/gpu/run.sh.
#
# Starts the baton binary standalone on the GPU with a dummy model of the
# Qwen3-1.7B shape (test/gpu/models/qwen3-1.7b, f16 weights, the Qwen3
# tokenizer from testdata), runs `baton bench serve` at 1 and 32 streams
# (--input-len 512, --output-len 128) and, one stream, TTFT_PROMPTS prompts
# of each of TTFT_LENS tokens with TTFT_OUT tokens out; then the same
# through router + prefill + decode on the one GPU (every prompt handed
# over) for each of TRANSPORTS: tcp (1 and 32 streams, the TTFT runs) and
# cuda-ipc (32 streams, the TTFT runs; skipped, with a line saying so,
# unless DEVICE is cuda). Around each PD TTFT run it reads decode's
# /metrics (KV bytes landed, transfer seconds and handoffs) into
# OUT/served-MODE-ttftLEN.kv, and after cuda-ipc prefill's pages shipped
# from the device and from the host into OUT/served-pd-ipc-shipped.kv.
# Last, SYNTH_MODEL (test/gpu/models/synth-1b, TinyLlama 1.1B's shape,
# with the Llama SPM vocabulary of testdata) standalone in each of
# SYNTH_DTYPES at 1 and 32 streams. Each report is JSON in
# OUT/served-*.json; the calls use distinct seeds, so that no run's
# prompts are in the prefix cache from an earlier one.
#
# MODEL, DEVICE, DTYPE, INPUT_LEN, OUTPUT_LEN, PROMPTS, PD_MEM, TTFT_LENS,
# TTFT_PROMPTS, TTFT_OUT, TRANSPORTS, SYNTH_MODEL, SYNTH_TOKENIZER and
# SYNTH_DTYPES override the defaults (a CPU run of small configs checks
# the script itself); SYNTH_DTYPES= skips the synth runs.
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
TTFT_LENS=${TTFT_LENS-512 4096}
TTFT_PROMPTS=${TTFT_PROMPTS:-5}
TTFT_OUT=${TTFT_OUT:-8}
TRANSPORTS=${TRANSPORTS-tcp cuda-ipc}
SYNTH_MODEL=${SYNTH_MODEL:-test/gpu/models/synth-1b/config.json}
SYNTH_TOKENIZER=${SYNTH_TOKENIZER:-testdata/vocab/ggml-vocab-llama-spm.gguf}
SYNTH_DTYPES=${SYNTH_DTYPES-f16 q8_0 q4_k_m}
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

# bench NAME PORT CONCURRENCY [INPUT_LEN OUTPUT_LEN PROMPTS]: one report,
# OUT/served-NAME-cCONCURRENCY.json. One stream sends at most 8 prompts
# unless PROMPTS is given. CONCURRENCY warm-up requests go first, left
# out of the figures: the decode batch sizes they pass through have their
# graphs captured before the measured run, as a server that captures at
# start-up would. The seed follows the lengths and concurrency:
# each server sees new prompts in every call, and the modes the same ones.
bench() {
  local in=${4:-$INPUT_LEN} out=${5:-$OUTPUT_LEN} n=${6:-}
  if [ -z "$n" ]; then
    n=$PROMPTS
    [ "$3" = 1 ] && n=$((PROMPTS < 8 ? PROMPTS : 8))
  fi
  "$BATON" bench serve --url "http://127.0.0.1:$2" --concurrency "$3" --num-prompts "$n" --warmup-requests "$3" \
    --input-len "$in" --output-len "$out" --temperature 0 --seed "$((in * 1000 + out * 100 + $3))" --json --progress=false \
    >"$OUT/served-$1-c$3.json"
  echo "served $1 c=$3: $(tr -d '\n' <"$OUT/served-$1-c$3.json" | head -c 400)"
}

# counters PORT NAME...: the values of the named counters (summed over
# their labels) on the server's /metrics, one a line.
counters() {
  local port=$1
  shift
  curl -sf "http://127.0.0.1:$port/metrics" | awk -v names="$*" '
    BEGIN { n = split(names, want, " "); for (i = 1; i <= n; i++) v[want[i]] = 0 }
    /^#/ { next }
    { name = $1; sub(/\{.*/, "", name); if (name in v) v[name] += $2 }
    END { for (i = 1; i <= n; i++) printf "%.17g\n", v[want[i]] }'
}

# ttft NAME PORT [DECODE_PORT]: the one-stream TTFT runs; with a decode
# port, the handoffs' figures from decode's /metrics around each run to
# OUT/served-NAME-ttftLEN.kv (bytes, transfer seconds, handoffs; the
# warm-up request's handoff among them, a prompt of the same length).
ttft() {
  local l before after
  for l in $TTFT_LENS; do
    [ -n "${3:-}" ] && before=$(counters "$3" baton_kv_transfer_bytes_total baton_kv_transfer_seconds_sum baton_kv_transfer_seconds_count)
    bench "$1-ttft$l" "$2" 1 "$l" "$TTFT_OUT" "$TTFT_PROMPTS"
    if [ -n "${3:-}" ]; then
      after=$(counters "$3" baton_kv_transfer_bytes_total baton_kv_transfer_seconds_sum baton_kv_transfer_seconds_count)
      paste <(echo "$before") <(echo "$after") | awk '
        { d[NR] = $2 - $1 }
        END { printf "bytes %.17g\nseconds %.17g\nhandoffs %.17g\n", d[1], d[2], d[3] }' >"$OUT/served-$1-ttft$l.kv"
      echo "served $1 ttft$l handoffs: $(tr '\n' ' ' <"$OUT/served-$1-ttft$l.kv")"
    fi
  done
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
ttft standalone 18400
stop_all

for transport in $TRANSPORTS; do
  mode=pd
  if [ "$transport" = cuda-ipc ]; then
    mode=pd-ipc
    if [ "$DEVICE" != cuda ]; then
      echo "served: the cuda-ipc runs skipped: cuda-ipc needs both workers on --device cuda (DEVICE=$DEVICE)"
      continue
    fi
  fi
  start 18410 "served-$mode-prefill.log" --role prefill --grpc-port 18411 --transport "$transport" "${LOAD[@]}" ${PD_MEM:+"$PD_MEM"}
  start 18420 "served-$mode-decode.log" --role decode --grpc-port 18421 --transfer-port 18422 --transport "$transport" "${LOAD[@]}" ${PD_MEM:+"$PD_MEM"}
  ready 18410
  ready 18420
  start 18430 "served-$mode-router.log" --role router --host 127.0.0.1 --prefill http://127.0.0.1:18410 \
    --decode http://127.0.0.1:18420 --disagg-prefill-threshold 0
  ready 18430
  # cuda-ipc's one-stream figure is its TTFT runs'; its 32 streams set
  # its throughput against standalone's.
  [ "$mode" = pd ] && bench "$mode" 18430 1
  bench "$mode" 18430 32
  ttft "$mode" 18430 18420
  if [ "$mode" = pd-ipc ]; then
    curl -sf http://127.0.0.1:18410/metrics | awk '
      /^baton_kv_pages_shipped_total/ { w = /from="device"/ ? "device" : "host"; v[w] += $2 }
      END { printf "device %.17g\nhost %.17g\n", v["device"], v["host"] }' >"$OUT/served-pd-ipc-shipped.kv"
    echo "served pd-ipc pages shipped: $(tr '\n' ' ' <"$OUT/served-pd-ipc-shipped.kv")"
  fi
  stop_all
done

for dt in $SYNTH_DTYPES; do
  start 18440 "served-synth-$dt.log" --role standalone --model "$SYNTH_MODEL" --load-format dummy --dummy-dtype "$dt" \
    --tokenizer "$SYNTH_TOKENIZER" --device "$DEVICE" --host 127.0.0.1
  ready 18440
  bench "synth-$dt" 18440 1
  bench "synth-$dt" 18440 32
  stop_all
done
