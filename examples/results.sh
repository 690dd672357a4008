#!/usr/bin/env bash
# The results table of docs/examples.md: both servers, CPU-only, Auto and
# engine-only with a simulated engine, each server started fresh on a free
# loopback port. About 90 s. BIN=path/to/release overrides where the
# binaries are (default: target/release, built first).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-}
if [[ -z $BIN ]]; then
  cargo build --release -q -p crypto-offload-examples
  BIN=target/release
fi
BLOCK_LOAD=${BLOCK_LOAD:---connections 4 --depth 8 --duration 5 --read-percent 50 --random-percent 50}
RECORD_LOAD=${RECORD_LOAD:---sizes 64,512,1500,16384 --connections 1,16 --duration 2}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# start NAME ARGS…: runs a server, waits for its address, sets $addr and $pid.
start() {
  local name=$1; shift
  "$BIN/$name" --listen 127.0.0.1:0 "$@" >"$work/out" 2>"$work/err" &
  pid=$!
  for _ in $(seq 600); do
    addr=$(sed -n 's/^listening on //p' "$work/out")
    [[ -n $addr ]] && return
    sleep 0.1
  done
  echo "$name did not start:" >&2; cat "$work/err" >&2; exit 1
}
stop() { kill -TERM "$pid"; wait "$pid"; }

for run in "CPU only|--backend cpu" "Auto, sim:qce|--sim qce" "engine only, sim:qce|--sim qce --backend sim:qce"; do
  title=${run%%|*}; flags=${run#*|}
  rm -f "$work/vol" "$work/vol.key"
  start block-server --volume "$work/vol" $flags
  echo "== block store, $title: block-server $flags; block-load $BLOCK_LOAD"
  # shellcheck disable=SC2086
  "$BIN/block-load" --addr "$addr" $BLOCK_LOAD
  stop
  echo
done

for run in "CPU only|--backend cpu" "Auto, sim:eip197|--sim eip197" "engine only, sim:eip197|--sim eip197 --backend sim:eip197"; do
  title=${run%%|*}; flags=${run#*|}
  start record-server $flags
  echo "== record server, $title: record-server $flags; record-load $RECORD_LOAD --backend cpu"
  # shellcheck disable=SC2086
  "$BIN/record-load" --addr "$addr" $RECORD_LOAD --backend cpu
  stop
  echo
done
