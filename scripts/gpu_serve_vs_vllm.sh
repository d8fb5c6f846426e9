#!/usr/bin/env bash
# On the GPU machine (device tool): our offline rows, our server and vLLM 0.26's server on the
# same random Qwen3 checkpoint, each driven by both load clients (ours, rtp_llm.tools.bench_serve,
# and vLLM's `vllm bench serve`), in one run. Results: $OUT/serve.jsonl (our client: a line per
# server x point), vLLM's client's summary lines in the output, $OUT/ours_offline.jsonl, the
# servers' logs.
#
# Here, before the call: the vLLM peer staged as ../shared/bench/vllm_peer/README.md says (.peer/c1..c3
# in three calls, .peer/c4 in this one), and in the ignored folder .gpu the wheel and a Qwen3
# tokenizer directory:  cp bazel-bin/rtp_llm/rtp_llm-*.whl .gpu/; cp -r TOKENIZER_DIR .gpu/qwen3-tokenizer
# The call: run(command="bash scripts/gpu_serve_vs_vllm.sh [ARCH]", carry=[".peer/c4", ".gpu"]).
# Python runs from /tmp: from the checkout, `python -m` would import the source tree (no protos).
set -u
ARCH=${1:-qwen3-0.6b}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
TOK=$ROOT/.gpu/qwen3-tokenizer SJ=$OUT/serve.jsonl VB=/tmp/vb
mkdir -p $VB && cd /tmp
POINTS=${POINTS:-"128:1024:64:128 128:1024:256:512 1024:128:64:256 1024:128:256:1024"}  # in:out:concurrency:prompts

t stage vllm; bash /tmp/vllm_dl/device_stage.sh "$ROOT/.peer/c4" >/dev/null && bash /tmp/vllm_dl/device_install.sh > /tmp/vllm_install.log 2>&1 || tail -20 /tmp/vllm_install.log
t install ours; PYTHON=python3 bash "$ROOT/scripts/install_unpacked.sh" "$ROOT"/.gpu/rtp_llm-*.whl /tmp/ours >/dev/null || exit 1
OURS="env PYTHONPATH=/tmp/ours python3"
CKPT=$($OURS -c "from rtp_llm.tools.random_checkpoint import write; print(write('$ARCH', '/tmp/ckpt_$ARCH', '$TOK'))" | tail -1)
t checkpoint $CKPT

row() {  # label report.json: one line of serve.jsonl
  $OURS - "$@" <<'PY'
import json, sys
label, path, out = sys.argv[1:4]
r = json.load(open(path)); s = r["server"]; c = r["client_cpu"]
row = {"label": label, "in": r["input_len"], "out": r["output_len"], "c": r["concurrency"], "n": r["num_prompts"],
       "ok": r["completed"], "failed": r["failed"], "out_tok_s": r["output_token_throughput"],
       "total_tok_s": r["total_token_throughput"], "ttft_p50": r["ttft_ms"].get("p50"),
       "tpot_p50": r["tpot_ms"].get("p50"), "itl_p50": r["itl_ms"].get("p50"), "itl_p99": r["itl_ms"].get("p99"),
       "tok_per_chunk": r["tokens_per_chunk"], "engine_tok_s": s.get("engine_output_tok_s"),
       "client_procs": r["client_procs"], "client_cores": c["cores_used"], "client_max_core": c["max_process_core_fraction"]}
print(json.dumps(row)); open(out, "a").write(json.dumps(row) + "\n")
PY
}
our_client() {  # label port
  for p in $POINTS; do IFS=: read i o c n <<<"$p"
    timeout 180 $OURS -m rtp_llm.tools.bench_serve --base_url http://127.0.0.1:$2 --num_prompts $n --input_len $i \
      --output_len $o --concurrency $c --seed $c --json_out /tmp/r.json > /tmp/bs.log 2>&1 && row $1 /tmp/r.json $SJ || tail -5 /tmp/bs.log
  done; }
vllm_client() {  # label port
  args=(); for p in $POINTS; do IFS=: read i o c n <<<"$p"; args+=($i $o $c $n); done
  bash /tmp/vllm_dl/serve_bench.sh $2 $1 $TOK $VB "${args[@]}"; }
wait_up() {  # port path pid
  for _ in $(seq 1 240); do curl -sf -o /dev/null http://127.0.0.1:$1/$2 && return 0; kill -0 $3 2>/dev/null || return 1; sleep 1; done; return 1; }

t offline; timeout 200 $OURS -m rtp_llm.tools.bench_gpu --checkpoint $CKPT --skip server,hf --shapes 128x1024,1024x128 \
  --concurrency 64,256 --out $OUT/ours_offline.jsonl 2>&1 | grep -E '"case"|Error' | cut -c1-300

t our server; $OURS -m rtp_llm.start_server --checkpoint_path=$CKPT --model_type=qwen_3 --start_port=30000 --device=cuda \
  --max_batch_size=256 --max_seq_len=2176 --max_num_batched_tokens=8192 > $OUT/ours_server.log 2>&1 & OP=$!
if wait_up 30000 health $OP; then
  $OURS -m rtp_llm.tools.bench_serve --base_url http://127.0.0.1:30000 --num_prompts 8 --input_len 64 --output_len 8 --concurrency 4 >/dev/null 2>&1
  t ours up; our_client ours_client@ours 30000; vllm_client vllm_client@ours 30000
else echo "our server did not come up"; tail -20 $OUT/ours_server.log; fi
kill -TERM $OP; wait $OP

t vllm server; PYTHONPATH=/tmp/vllm_site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 python3 -m vllm.entrypoints.cli.main serve $CKPT \
  --dtype bfloat16 --port 8000 --max-model-len 2176 --max-num-seqs 256 --max-num-batched-tokens 8192 \
  --gpu-memory-utilization 0.85 --served-model-name qwen3 --tokenizer $TOK > $OUT/vllm_server.log 2>&1 & VP=$!
if wait_up 8000 v1/models $VP; then t vllm up; vllm_client vllm_client@vllm 8000; our_client ours_client@vllm 8000
else echo "vllm did not come up"; tail -20 $OUT/vllm_server.log; fi
kill -TERM $VP; wait $VP; t done
