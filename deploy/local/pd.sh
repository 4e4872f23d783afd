#!/usr/bin/env bash
# Starts router + prefill + decode on loopback with the bundled model (what
# `make run` does). Ctrl-C or SIGTERM stops all three gracefully and exits 0
# (1 if one of them failed to stop); a second Ctrl-C kills them.
set -euo pipefail
BIN=${BIN:-bin/baton}
PORT=${PORT:-8000}
ARGS=(--host 127.0.0.1 --kv-poison "$@")
pids=()
# stop asks each server to drain (SIGTERM) and waits for it: an interrupt
# the user asked for is a clean end, so the script's status is the servers'
# (make would otherwise report the signal as an error).
stop() {
  trap 'kill -KILL "${pids[@]}" 2>/dev/null; exit 1' INT TERM
  trap - EXIT
  kill -TERM "${pids[@]}" 2>/dev/null || true
  local rc=0 pid
  for pid in "${pids[@]}"; do
    wait "$pid" || { echo "pd.sh: process $pid exited $?" >&2; rc=1; }
  done
  exit "$rc"
}
trap stop INT TERM
# Each server in a process group of its own: a terminal's Ctrl-C reaches
# the script alone, which stops the servers once each. Sent to the servers
# as well it would race the script's SIGTERM, and a server that had begun
# to drain takes a second signal as "stop now" (exit 143, not 0).
set -m
# Whatever else ends the script (a server that died, a failed start)
# takes the others with it.
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' EXIT
"$BIN" serve --role decode  --port $((PORT+200)) --grpc-port $((PORT+201)) --transfer-port $((PORT+202)) "${ARGS[@]}" & pids+=($!)
"$BIN" serve --role prefill --port $((PORT+100)) --grpc-port $((PORT+101)) "${ARGS[@]}" & pids+=($!)
for url in http://127.0.0.1:$((PORT+100)) http://127.0.0.1:$((PORT+200)); do
  for _ in $(seq 100); do curl -fs "$url/health" >/dev/null 2>&1 && break; sleep 0.1; done
done
# ROUTER_ARGS adds flags to the router alone (e.g. --disagg-prefill-threshold 0).
read -r -a router_args <<<"${ROUTER_ARGS:-}"
"$BIN" serve --role router --host 127.0.0.1 --port "$PORT" \
  --prefill http://127.0.0.1:$((PORT+100)) --decode http://127.0.0.1:$((PORT+200)) "${router_args[@]}" & pids+=($!)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break; sleep 0.1; done
echo
echo "try: curl -s http://127.0.0.1:$PORT/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":64}'"
echo
# One server ending on its own ends the run with its status.
wait -n
