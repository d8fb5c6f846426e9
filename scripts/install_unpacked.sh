#!/usr/bin/env bash
# Installs an rtp_llm wheel built here where pip will not take it as is: another Python minor
# or torch (the GPU machine: Python 3.12, its own CUDA torch, no Bazel). The engine core is a C
# library loaded through ctypes and everything else is Python, so unpacking the wheel onto
# PYTHONPATH is a complete install for the CUDA path; the CPU compute-ops extension (built
# against this machine's torch) is simply never loaded there.
#
#   scripts/install_unpacked.sh dist/rtp_llm-*.whl /opt/rtp_llm [EXTRA.whl ...] && export PYTHONPATH=/opt/rtp_llm
# EXTRA wheels (e.g. xgrammar and its dependencies, fetched here for that Python with `pip
# download --python-version 3.12 --only-binary=:all:`) are unpacked beside it, as they are.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 WHEEL DEST_DIR [EXTRA_WHEEL ...]" >&2
  exit 2
fi
whl=$1
dest=$2
shift 2
py=${PYTHON:-python3}
whl=$(realpath "$whl")
rm -rf "$dest"
mkdir -p "$dest"
"$py" -m zipfile -e "$whl" "$dest"
for extra in "$@"; do "$py" -m zipfile -e "$extra" "$dest"; done
dest=$(realpath "$dest")
cd "$dest"  # not where a source tree's rtp_llm/ would shadow the installed one
PYTHONPATH="$dest" "$py" - <<'PY'
import importlib.util
import sys

need = ["numpy", "grpc", "google.protobuf", "aiohttp", "transformers", "safetensors", "tokenizers", "tqdm", "torch"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"install_unpacked: missing Python packages: {', '.join(missing)} (see deps/requirements_base.txt)")
if importlib.util.find_spec("xgrammar") is None:  # optional: without it grammars are refused (400)
    print("install_unpacked: xgrammar is not installed: structured output (json_schema, regex, ...) is refused")
from rtp_llm.ops.engine_core import EngineCore  # noqa: F401  (loads libth_transformer.so)
from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2  # noqa: F401  (protobuf gencode vs runtime)
import torch

print(f"install_unpacked: rtp_llm ready; torch {torch.__version__}, CUDA GPU: {torch.cuda.is_available()}")
PY
