#!/usr/bin/env bash
# On the GPU machine (device tool), issue 25's measurements in one call: the speculative GPU tests
# given as arguments (pytest -k expression, "" for none), bench_spec's EAGLE-3 rows for Qwen3-8B
# (random weights, forced 70% acceptance, both draft paces), and profile_host's host phases of a
# plain step and of an EAGLE-3 round. Prepare .gpu as scripts/gpu_tests.sh says, then
#   run(command="bash scripts/gpu_spec.sh 'TEST EXPR'", carry=[".gpu"])
# Results go to $OUT (bench_spec.txt, profile_*.txt with cprofile_*.txt and timeline_*.txt, tests.txt).
# BENCH=0: no bench_spec rows; VANILLA=1: bench_spec's rows with a draft model of Qwen3-0.6B's shape too;
# PROFILE=0: no profiles; BATCH=1: bench_spec's batch sizes.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TESTS=${1:-}
BATCH=${BATCH:-1,16}
if [ -n "$TESTS" ]; then
  timeout 330 bash "$ROOT/scripts/gpu_tests.sh" "$ROOT/tests/test_cuda_speculative.py" -k "$TESTS" 2>&1 | tail -25 > "$OUT/tests.txt"
else
  PYTHON=python3 bash "$ROOT/scripts/install_unpacked.sh" "$ROOT"/.gpu/rtp_llm-*.whl /tmp/ours >/dev/null || exit 1
fi
cd /tmp || exit 1
export PYTHONPATH=/tmp/ours
TOK=$ROOT/.gpu/qwen3-tokenizer
# Qwen3-8B's config (weights made at load: --load_format dummy) and a random EAGLE-3 head for it,
# where bench_spec makes them.
CKPT=/tmp/rtp_llm_spec_qwen3-8b
HEAD=/tmp/rtp_llm_spec_qwen3-8b_eagle3_32000
python3 -c "
import json
from rtp_llm.tools.random_checkpoint import write_config, write_eagle3_head
write_config('qwen3-8b', '$CKPT', '$TOK')
write_eagle3_head('$HEAD', json.load(open('$CKPT/config.json')), draft_vocab=32000, scale=0.02)" || exit 1
if [ "${BENCH:-1}" = 1 ]; then
  timeout 240 python3 -m rtp_llm.tools.bench_spec --checkpoint $CKPT --load_format dummy --sp_type eagle3 \
    --sp_checkpoint_path $HEAD --device cuda --force_accept 0.7 --batch "$BATCH" --repeats 3 --new_tokens 128 \
    --gen_num_per_cycle 4 --sp_draft_pace adaptive,fixed --kv_cache_mem_mb 4000 > "$OUT/bench_spec.txt" 2>&1
fi
if [ "${VANILLA:-0}" = 1 ]; then  # a draft model of Qwen3-0.6B's shape
  timeout 240 python3 -m rtp_llm.tools.bench_spec --arch qwen3-8b --draft_arch qwen3-0.6b --tokenizer "$TOK" \
    --device cuda --force_accept 0.7 --batch 1 --repeats 3 --new_tokens 128 --gen_num_per_cycle 4 \
    --sp_draft_pace adaptive,fixed --kv_cache_mem_mb 4000 > "$OUT/bench_vanilla.txt" 2>&1
fi
PH="python3 -m rtp_llm.tools.profile_host --checkpoint $CKPT --load_format dummy --device cuda --batch 1 --no_schema"
if [ "${PROFILE:-1}" = 1 ]; then
  timeout 120 $PH --cprofile "$OUT/cprofile_plain.txt" --device_timeline "$OUT/timeline_plain.txt" > "$OUT/profile_plain.txt" 2>&1
  timeout 120 $PH --sp_type eagle3 --sp_checkpoint_path "$HEAD" --gen_num_per_cycle 4 --sp_draft_pace fixed \
    --force_accept 0.7 --cprofile "$OUT/cprofile_eagle3.txt" --device_timeline "$OUT/timeline_eagle3.txt" \
    > "$OUT/profile_eagle3.txt" 2>&1
fi
tail -n 4 "$OUT"/profile*.txt "$OUT"/tests.txt 2>/dev/null
tail -n 9 "$OUT"/bench*.txt
head -n 1 "$OUT"/timeline*.txt
