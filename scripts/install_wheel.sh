#!/usr/bin/env bash
# Builds //rtp_llm:rtp_llm_whl and installs it (with its pinned requirements) into a virtual
# environment, creating it when missing. Prints the venv's python on the last line.
#
#   scripts/install_wheel.sh [VENV]        (default: $RTP_LLM_RUN_VENV or ~/.cache/rtp_llm/run-venv)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-${RTP_LLM_RUN_VENV:-$HOME/.cache/rtp_llm/run-venv}}
cd "$ROOT"

bazelisk build //rtp_llm:rtp_llm_whl >&2
WHEEL=$(ls -t bazel-bin/rtp_llm/rtp_llm-*.whl | head -n 1)
# The venv is made by the same interpreter the wheel was built for (its cpXY tag).
PYTHON=$(sed -n 's/^build --repo_env=PYTHON_BIN_PATH=//p' .bazelrc.user)
BASE=$("$PYTHON" -c 'import sys; print(sys._base_executable)')
[ -x "$VENV/bin/python" ] || "$BASE" -m venv "$VENV" >&2
"$VENV/bin/python" -m pip install -q "$WHEEL" >&2                      # requirements, once
"$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$WHEEL" >&2  # this build
echo "[install_wheel] installed $(basename "$WHEEL") into $VENV" >&2
echo "$VENV/bin/python"
