#!/usr/bin/env bash
# On the GPU machine (device tool): our offline rows, our server and vLLM 0.26's server on the
# same random Qwen3 checkpoint, driven by the same load client (ours, rtp_llm.tools.bench_serve;
# vLLM's `vllm bench serve` too where VLLM_CLIENT=1), in two back-to-back calls (the machine
# keeps /tmp between them while it stays warm):
#   run(command="bash scripts/gpu_serve_vs_vllm.sh ours ARCH", carry=[".peer/c4", ".gpu"])
#     stages vLLM's last batch, installs both, writes the checkpoint, then our offline rows and
#     our server at each per-step token budget in BUDGETS (default 8192, ours' and vLLM's on CUDA;
#     SCHEMA_POINTS at the last);
#   run(command="bash scripts/gpu_serve_vs_vllm.sh vllm ARCH")
#     vLLM's server (--max-num-batched-tokens 8192, its H200 default) with the same client.
# SERVER_ARGS: more flags for our server (e.g. --host_profile=1: its log then holds the engine
# thread's host time by phase, a line per point).
# ARCH: random_checkpoint's (written to disk), or bench_moe's (e.g. qwen3-30b-a3b, too large for
# the disk: config.json only, and both servers make random weights at start, --load_format=dummy).
# Results: $OUT/serve.jsonl (a line per server x budget x point), $OUT/ours_offline.jsonl, logs.
#
# Here, before the calls: the vLLM peer staged as ../shared/bench/vllm_peer/README.md says
# (.peer/c1..c3 in three calls), and in the ignored folder .gpu the wheel and a Qwen3 tokenizer:
#   cp bazel-bin/rtp_llm/rtp_llm-*.whl .gpu/; cp -r TOKENIZER_DIR .gpu/qwen3-tokenizer
# A dry run of the plumbing on a CPU machine:
#   DEVICE=cpu OFFLINE=0 POINTS=16:8:2:4 SCHEMA_POINTS=16:8:1:2 BUDGETS=2048 OUT=DIR ... ours qwen3-0.6b
# Python runs from /tmp: from the checkout, `python -m` would import the source tree (no protos).
set -u
PHASE=${1:?ours or vllm} ARCH=${2:-qwen3-0.6b}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
T0=$(date +%s); t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
DEVICE=${DEVICE:-cuda} W=/tmp/gsv TOK=/tmp/gsv/tok SJ=$OUT/serve.jsonl CKPT=/tmp/ckpt_$ARCH
mkdir -p $W && cd /tmp
# in:out:concurrency:prompts
POINTS=${POINTS-"128:1024:64:128 128:1024:256:512 128:1024:1024:1024 1024:128:64:256 1024:128:256:1024 1024:128:1024:2048"}
# Structured output (issue 20): each point unconstrained, then every request under bench_serve's
# "long" JSON schema (an array of strings that stays open for any output length); "" skips them.
SCHEMA_POINTS=${SCHEMA_POINTS-"128:256:1:8 128:256:64:128 128:256:256:512"}
MAXC=$(echo $POINTS $SCHEMA_POINTS | tr " " "\n" | cut -d: -f3 | sort -n | tail -1)  # (either list may be "")
OURS="env PYTHONPATH=/tmp/ours python3"
DUMMY=0 OUR_MODEL=--model_type=qwen_3 VLLM_LOAD=
arch_kind() {  # (once ours is installed) bench_moe's architectures: random weights made at start
  if $OURS -c "from rtp_llm.tools.bench_moe import ARCHS; exit(0 if '$ARCH' in ARCHS else 1)" 2>/dev/null; then
    DUMMY=1 OUR_MODEL=--load_format=dummy VLLM_LOAD="--load-format dummy"; fi; }

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
bench() {  # label port in out c n [bench_serve args]: one point, one line of serve.jsonl
  timeout 240 $OURS -m rtp_llm.tools.bench_serve --base_url http://127.0.0.1:$2 --num_prompts $6 --input_len $3 \
    --output_len $4 --concurrency $5 --seed $5 --json_out $W/r.json "${@:7}" > $W/bs.log 2>&1 && row $1 $W/r.json $SJ || tail -5 $W/bs.log; }
our_client() {  # label port [schema]: POINTS; with "schema", SCHEMA_POINTS unconstrained and under a JSON schema
  for p in $POINTS; do IFS=: read i o c n <<<"$p"; bench $1 $2 $i $o $c $n; done
  [ "${3:-}" = schema ] || return 0
  for p in $SCHEMA_POINTS; do IFS=: read i o c n <<<"$p"
    bench $1_free $2 $i $o $c $n; bench $1_schema $2 $i $o $c $n --json_schema long; done; }
vllm_client() {  # label port
  [ "${VLLM_CLIENT:-0}" = 1 ] || return 0
  args=(); for p in $POINTS; do IFS=: read i o c n <<<"$p"; args+=($i $o $c $n); done
  bash /tmp/vllm_dl/serve_bench.sh $2 $1 $TOK $W/vb "${args[@]}"; }
wait_up() {  # port path pid
  for _ in $(seq 1 300); do curl -sf -o /dev/null http://127.0.0.1:$1/$2 && return 0; kill -0 $3 2>/dev/null || return 1; sleep 1; done; return 1; }

if [ "$PHASE" = ours ]; then
  mkdir -p $W/vb; rm -rf $TOK; cp -r "$ROOT/.gpu/qwen3-tokenizer" $TOK
  [ -d /tmp/vllm_site ] || [ ! -d "$ROOT/.peer/c4" ] || { t stage vllm; bash /tmp/vllm_dl/device_stage.sh "$ROOT/.peer/c4" >/dev/null && bash /tmp/vllm_dl/device_install.sh > $W/vllm_install.log 2>&1 || tail -20 $W/vllm_install.log; }
  t install ours; PYTHON=python3 bash "$ROOT/scripts/install_unpacked.sh" "$ROOT"/.gpu/rtp_llm-*.whl /tmp/ours $(ls "$ROOT"/.gpu/wheels/*.whl /tmp/gpu_wheels/*.whl 2>/dev/null) >/dev/null || exit 1
  arch_kind
  if [ "$DUMMY" = 1 ]; then $OURS -c "from rtp_llm.tools.bench_moe import write_checkpoint; write_checkpoint('$ARCH', '$CKPT', '$TOK')"
  else [ -f $CKPT/config.json ] || $OURS -c "from rtp_llm.tools.random_checkpoint import write; print(write('$ARCH', '$CKPT', '$TOK'))" | tail -1; fi
  t checkpoint $CKPT
  CONC=$(echo $POINTS | tr ' ' '\n' | cut -d: -f3 | sort -un | paste -sd,)
  if [ "${OFFLINE:-1}" = 1 ] && [ "$DUMMY" = 1 ]; then t offline; timeout 400 $OURS -m rtp_llm.tools.bench_moe offline --arch $ARCH \
      --concurrency $CONC --max_batch_size $MAXC --out $OUT/ours_offline.jsonl 2>&1 | grep -E '"case"|Error' | cut -c1-300
  elif [ "${OFFLINE:-1}" = 1 ]; then t offline; timeout 300 $OURS -m rtp_llm.tools.bench_gpu --arch $ARCH --checkpoint $CKPT --skip server,hf --shapes 128x1024,1024x128 \
      --concurrency $CONC --max_batch_size $MAXC --out $OUT/ours_offline.jsonl 2>&1 | grep -E '"case"|Error' | cut -c1-300; fi
  BUDGETS=${BUDGETS:-8192}; LAST=${BUDGETS##* }
  for B in $BUDGETS; do
    t our server, budget $B; $OURS -m rtp_llm.start_server --checkpoint_path=$CKPT $OUR_MODEL --start_port=30000 \
      --device=$DEVICE --max_batch_size=$MAXC --max_seq_len=2176 --max_num_batched_tokens=$B ${SERVER_ARGS:-} > $OUT/ours_server_$B.log 2>&1 & OP=$!
    if wait_up 30000 health $OP; then
      $OURS -m rtp_llm.tools.bench_serve --base_url http://127.0.0.1:30000 --num_prompts 8 --input_len 64 --output_len 8 --concurrency 4 >/dev/null 2>&1
      t ours up; our_client ours_b$B 30000 $([ $B = $LAST ] && echo schema); vllm_client vllm_client@ours_b$B 30000
    else echo "our server did not come up"; tail -20 $OUT/ours_server_$B.log; fi
    kill -TERM $OP; wait $OP
  done
else
  [ -d /tmp/vllm_site ] || { echo "vLLM is not staged (the machine was given back?): run the ours phase first"; exit 1; }
  arch_kind
  t vllm server; PYTHONPATH=/tmp/vllm_site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 python3 -m vllm.entrypoints.cli.main serve $CKPT \
    --dtype bfloat16 --port 8000 --max-model-len 2176 --max-num-seqs $MAXC --max-num-batched-tokens 8192 \
    --gpu-memory-utilization 0.85 --served-model-name qwen3 --tokenizer $TOK $VLLM_LOAD > $OUT/vllm_server.log 2>&1 & VP=$!
  if wait_up 8000 v1/models $VP; then t vllm up; our_client vllm_b8192 8000 schema; vllm_client vllm_client@vllm 8000
  else echo "vllm did not come up"; tail -20 $OUT/vllm_server.log; fi
  kill -TERM $VP; wait $VP
fi
t done
