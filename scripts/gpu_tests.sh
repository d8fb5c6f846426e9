#!/usr/bin/env bash
# On the GPU machine (device tool): the GPU test suites against the wheel built here, unpacked
# onto PYTHONPATH (scripts/install_unpacked.sh: the GPU machine has its own Python and torch).
# Here, before the call: cp bazel-bin/rtp_llm/rtp_llm-*.whl .gpu/ (an ignored folder; .gpu/wheels/
# may hold extra wheels for the GPU machine's Python, e.g. xgrammar's and pydantic's, see
# install_unpacked.sh, and .gpu/testwheels/ the tests' own, e.g. jsonschema's for
# test_structured_output.py; an earlier call may have left them in /tmp/gpu_wheels, where a carry
# would be too large), and the Qwen3 tokenizer in .gpu/qwen3-tokenizer; then
#   run(command="bash scripts/gpu_tests.sh [PYTEST ARGS]", carry=[".gpu"])
# Default: tests/test_cuda.py, test_cuda_kernels.py, test_cuda_moe.py, test_cuda_mla.py,
# test_cuda_fp8.py. Runs from /tmp: from the checkout `rtp_llm` would be the source tree (no built
# libraries or protos).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=python3 bash "$ROOT/scripts/install_unpacked.sh" "$ROOT"/.gpu/rtp_llm-*.whl /tmp/ours $(ls "$ROOT"/.gpu/wheels/*.whl "$ROOT"/.gpu/testwheels/*.whl /tmp/gpu_wheels/*.whl 2>/dev/null) >/dev/null || exit 1
[ $# -gt 0 ] || set -- "$ROOT"/tests/test_cuda{,_kernels,_moe,_mla,_fp8}.py
# The tests' model cache: the Qwen3 tokenizer carried in .gpu (the machine has no network, so
# fetch_models.sh cannot run there), unless RTP_LLM_MODEL_CACHE says otherwise.
if [ -z "${RTP_LLM_MODEL_CACHE:-}" ] && [ -f "$ROOT/.gpu/qwen3-tokenizer/tokenizer.json" ]; then
  export RTP_LLM_MODEL_CACHE=/tmp/gpu_model_cache
  mkdir -p $RTP_LLM_MODEL_CACHE && rm -rf $RTP_LLM_MODEL_CACHE/qwen3-tokenizer && cp -r "$ROOT/.gpu/qwen3-tokenizer" $RTP_LLM_MODEL_CACHE/
fi
cd /tmp && PYTHONPATH=/tmp/ours python3 -m pytest -q -p no:cacheprovider "$@"
