#!/usr/bin/env bash
# On the GPU machine (device tool): quantized checkpoints, ours and vLLM's engine on the same files
# (rtp_llm.tools.bench_quant: random bf16 weights of ARCH, quantized by our own rtp_llm.tools.quantize), one
# process per engine and checkpoint, results appended to $OUT/quant_ARCH.jsonl.
#   bash scripts/gpu_quant_vs_vllm.sh ENGINES ARCH QUANTS
#   e.g. bash scripts/gpu_quant_vs_vllm.sh ours,vllm qwen3-8b bf16,fp8
# Ours installed in /tmp/ours (scripts/install_unpacked.sh), vLLM in /tmp/vllm_site
# (../shared/bench/vllm_peer/README.md). SHAPES and CONCURRENCY (default 128x1024,1024x128 and
# 256) pick the throughput rows; KV=fp8 runs both engines with an e4m3 KV cache; each process's whole
# output is kept in $OUT/ENGINE_ARCH_QUANT[_kvfp8].log (vLLM's names its KV cache's size in tokens).
# Block-FP8 weights run on our FP8 kernels only with RTP_LLM_CUDA_FP8_BLOCK=1 (else widened to bf16).
set -u
ENGINES=${1:?engines: ours,vllm}
ARCH=${2:?arch, e.g. qwen3-8b}
QUANTS=${3:-bf16,fp8}
OUT=${OUT:-/tmp}
SHAPES=${SHAPES:-128x1024,1024x128}
CONCURRENCY=${CONCURRENCY:-256}
KV=${KV:-auto}
TIMEOUT=${TIMEOUT:-300}  # seconds a process may take (a hung engine does not take the call)
export VLLM_USE_FLASHINFER_SAMPLER=0
cd /tmp || exit 1
for engine in ${ENGINES//,/ }; do
  for quant in ${QUANTS//,/ }; do
    echo "== $engine $ARCH $quant kv=$KV"
    log="$OUT/${engine}_${ARCH}_$quant$([ "$KV" = auto ] || echo "_kv$KV").log"
    PYTHONPATH=$([ "$engine" = vllm ] && echo /tmp/vllm_site:)/tmp/ours timeout "$TIMEOUT" python3 \
      -m rtp_llm.tools.bench_quant --engine "$engine" --arch "$ARCH" --quant "$quant" --shapes "$SHAPES" \
      --concurrency "$CONCURRENCY" --kv_cache_dtype "$KV" --out "$OUT/quant_$ARCH.jsonl" > "$log" 2>&1
    echo "rc=$?"; grep -E '^\{' "$log"; grep -vE '^\{' "$log" | tail -5
  done
done
