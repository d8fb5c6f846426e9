#!/usr/bin/env bash
# The main job on a fresh machine: bootstrap (if needed), build the wheel, install it into a
# virtual environment and run it. Until the server lands (issue: serving), "run it" means
# loading the engine core from the installed wheel, outside the source tree.
#
#   scripts/quickstart.sh [--device=cpu|cuda|ascend]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/bootstrap.sh" "$@"
PY=$("$ROOT/scripts/install_wheel.sh" | tail -n 1)
cd /tmp
"$PY" -c "from rtp_llm.ops import ensure_engine_ops_loaded; ensure_engine_ops_loaded(); print('OPS_LOAD_OK')"
"$PY" -c "from rtp_llm.ops import engine_build_info; print(engine_build_info())"
