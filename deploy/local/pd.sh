#!/usr/bin/env bash
# Starts router + prefill + decode on loopback with the bundled model (what
# `make run` does). Ctrl-C stops all three.
set -euo pipefail
BIN=${BIN:-bin/baton}
PORT=${PORT:-8000}
ARGS=(--host 127.0.0.1 --kv-poison "$@")
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT INT TERM
"$BIN" serve --role decode  --port $((PORT+200)) --grpc-port $((PORT+201)) --transfer-port $((PORT+202)) "${ARGS[@]}" & pids+=($!)
"$BIN" serve --role prefill --port $((PORT+100)) --grpc-port $((PORT+101)) "${ARGS[@]}" & pids+=($!)
for url in http://127.0.0.1:$((PORT+100)) http://127.0.0.1:$((PORT+200)); do
  for _ in $(seq 100); do curl -fs "$url/health" >/dev/null 2>&1 && break; sleep 0.1; done
done
"$BIN" serve --role router --host 127.0.0.1 --port "$PORT" \
  --prefill http://127.0.0.1:$((PORT+100)) --decode http://127.0.0.1:$((PORT+200)) & pids+=($!)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break; sleep 0.1; done
echo
echo "try: curl -s http://127.0.0.1:$PORT/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":64}'"
echo
wait -n
