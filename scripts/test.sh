#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run): bootstrap if needed, then
#  1. bazelisk test //...                            C++ (gtest) and Python unit tests
#  2. bazelisk test --config=aarch64 //rtp_llm/cpp/... the C++ tests cross-built for arm64,
#                                                    run under qemu (x86_64 hosts only)
#  3. bazelisk test --config=asan //rtp_llm/cpp/...  the C++ tests under AddressSanitizer
#  4. scripts/build_ascend.sh                        the Ascend wheel (--config=ascend): built
#                                                    against torch 2.9.0, strictly linked and checked
#  5. scripts/check_wheel.sh                         the installed wheel: loads, imports and
#                                                    is portable (bundled libraries)
#  6. pytest tests/                                  integration tests on real small models
#                                                    (fetched by scripts/fetch_models.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
step() { printf '\n=== %s\n' "$*"; }

step "bootstrap"
scripts/bootstrap.sh
step "bazelisk test //..."
bazelisk test //...
if [ "$(uname -m)" = x86_64 ]; then
  step "bazelisk test --config=aarch64 //rtp_llm/cpp/..."
  bazelisk test --config=aarch64 //rtp_llm/cpp/...
fi
step "bazelisk test --config=asan //rtp_llm/cpp/..."
bazelisk test --config=asan //rtp_llm/cpp/...
step "bazelisk build --config=ascend (strict link)"
scripts/build_ascend.sh --shutdown  # own output base and venv; --shutdown frees its server
step "installed wheel"
VENV_DIR=$(mktemp -d)
trap 'rm -rf "$VENV_DIR"' EXIT  # ~2 GB a run (torch): not left behind
VENV="$VENV_DIR/venv"
scripts/check_wheel.sh "$VENV"
step "integration tests (tests/) against the installed wheel"
"$VENV/bin/python" -m pip install -q -r deps/requirements_test.txt
PYTHON="$VENV/bin/python" scripts/fetch_models.sh >/dev/null
(cd /tmp && "$VENV/bin/python" -m pytest -q --durations=20 "$ROOT/tests")  # (the slowest 20: where CI time goes)
step "all tests passed"
