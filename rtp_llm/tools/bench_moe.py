"""MoE on the GPU: the fused routed-experts kernel (device/cuda/kernels/moe.py) alone, and whole
MoE models offline with random weights (--load_format=dummy), ours or vLLM's, the same prompts
as bench_gpu's offline rows.

    python -m rtp_llm.tools.bench_moe kernel [--arch qwen3-30b-a3b] [--tokens 1,8,64] [--sweep --tuned_out F]
    python -m rtp_llm.tools.bench_moe offline --engine ours|vllm [--arch qwen3-30b-a3b] [--out F.jsonl]

`kernel` times one MoE layer's routed experts replayed from a CUDA graph (device time, no launch
overhead) against moe_reference (torch, eager) and, where vLLM is importable, vLLM's fused_moe on
the same tensors; --sweep times every tile configuration and prints the best per token count.
`offline` prints batch-1 TTFT / TPOT (with the bandwidth floor of the weights a token reads: the
dense ones and K of E experts) and throughput at 1024/128 and 128/1024; run it once per engine in
the same session for the ratio (vLLM's dummy weights are refilled with ours: bench_gpu.vllm_offline).
One JSON line per measurement."""

import argparse
import dataclasses
import itertools
import json
import os
import shutil
import sys
import tempfile

import torch

from rtp_llm.tools.bench_gemv import graph_us
from rtp_llm.tools.bench_gpu import CONCURRENCY, copy_bandwidth, emit

# Random-weight architectures: HF config.json fields (the published checkpoints' values).
ARCHS = {
    "qwen3-30b-a3b": dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960, rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=False, torch_dtype="bfloat16", hidden_act="silu",
        bos_token_id=151643, eos_token_id=151645),
    "deepseek-v2-lite": dict(
        architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", hidden_size=2048, intermediate_size=10944,
        moe_intermediate_size=1408, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, n_group=1,
        topk_group=1, topk_method="greedy", scoring_func="softmax", norm_topk_prob=False, routed_scaling_factor=1.0,
        moe_layer_freq=1, first_k_dense_replace=1, num_hidden_layers=27, num_attention_heads=16,
        num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, vocab_size=102400, max_position_embeddings=163840, rope_theta=10000, rms_norm_eps=1e-6,
        rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                      "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
        attention_bias=False, tie_word_embeddings=False, torch_dtype="bfloat16", hidden_act="silu",
        bos_token_id=100000, eos_token_id=100001),
}


def active_weight_bytes(ckpt: str, elem: int = 2) -> int:
    """Bytes of the weights one decoded token reads (weights.active_elements)."""
    from rtp_llm.model_loader.hf_loader import read_hf_config
    from rtp_llm.model_loader.weights import active_elements

    return elem * active_elements(read_hf_config(ckpt))


def _graph_us(fn, reps: int = 20) -> float:
    """Device microseconds of one fn() call, replayed from a CUDA graph of `reps` calls."""
    return graph_us(lambda: [fn() for _ in range(reps)], reps)


def _eager_us(fn, reps: int = 10) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def _vllm_fused_moe():
    try:
        from vllm.model_executor.layers.fused_moe import fused_experts
        return fused_experts
    except Exception:  # not installed here, or not importable: measured without the peer
        return None


def sweep_space(rows_per_expert: float):
    """The tile configurations worth timing for a token count (by the rows an active expert
    gets): 16/32-row blocks for decode, larger ones for prompts; those whose pipeline needs
    more shared memory than an H200 SM has (227 KiB) are left out."""
    from rtp_llm.device.cuda.kernels.moe import MoeGemmConfig

    if rows_per_expert <= 16:
        space = itertools.product((16, 32), (32, 64, 128), (64, 128), (1,), (4,), (3, 4))
    else:
        space = itertools.product((32, 64, 128), (64, 128, 256), (64, 128), (1, 16), (4, 8), (3, 4))
    configs = [MoeGemmConfig(*c) for c in space]
    return [c for c in configs if c.shared_bytes(2) <= 227 * 1024]


def kernel(args):
    from rtp_llm.device.base import moe_reference
    from rtp_llm.device.cuda import kernels as K
    from rtp_llm.device.cuda.kernels.moe import layer_key, moe_config
    from rtp_llm.device.cuda.kernels.moe_tuned import to_json

    cfg = ARCHS[args.arch]
    e = cfg.get("num_experts") or cfg["n_routed_experts"]
    k, h, i = cfg["num_experts_per_tok"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    g = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.empty(e, 2 * i, h, dtype=torch.bfloat16, device="cuda").uniform_(-0.035, 0.035, generator=g)
    down = torch.empty(e, h, i, dtype=torch.bfloat16, device="cuda").uniform_(-0.035, 0.035, generator=g)
    bw = copy_bandwidth()
    vllm_moe = _vllm_fused_moe()
    key, tuned = None, {}
    for t in (int(s) for s in args.tokens.split(",")):
        x = torch.randn(t, h, dtype=torch.bfloat16, device="cuda", generator=g)
        w, ids = torch.softmax(torch.randn(t, e, device="cuda", generator=g), -1).topk(k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)
        touched = int(torch.unique(ids).numel())
        floor_us = touched * 3 * h * i * 2 / bw * 1e6  # each touched expert's weights read once
        rec = {"tokens": t, "experts_touched": touched, "weights_floor_us": floor_us,
               "ours_us": _graph_us(lambda: K.moe(x, gate_up, down, w, ids)),
               "config": str(moe_config(t, k, e, key := layer_key(x.device, x.dtype, e, i, h, k))),
               "reference_eager_us": _eager_us(lambda: moe_reference(x, gate_up, down, w, ids, K.silu_and_mul))}
        if vllm_moe is not None:
            wf, idf = w.float(), ids.to(torch.int32)
            rec["vllm_us"] = _graph_us(lambda: vllm_moe(x, gate_up, down, wf, idf))
        if args.sweep:
            best = None
            for c in sweep_space(t * k / min(e, t * k)):
                try:
                    us = _graph_us(lambda: K.moe(x, gate_up, down, w, ids, c), reps=5)
                except Exception as err:  # (a tile that does not fit the SM's shared memory)
                    print(f"# {c}: {type(err).__name__}", file=sys.stderr)
                    continue
                if best is None or us < best[0]:
                    best = (us, c)
            rec["sweep_best_us"], rec["sweep_best"] = best[0], str(best[1])
            tuned[t] = dataclasses.astuple(best[1])
        emit(args.out, dict(rec, mode="kernel", arch=args.arch))
    if tuned and args.tuned_out:
        with open(args.tuned_out, "w") as f:
            json.dump([to_json(key, tuned)], f, indent=1)


def write_checkpoint(arch: str, path: str, tokenizer: str = None) -> str:
    """A checkpoint directory for --load_format=dummy: ARCHS[arch]'s config.json, and the
    tokenizer's files beside it (a server detokenizes; vLLM's wants one)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(ARCHS[arch], f)
    if tokenizer:
        for name in os.listdir(tokenizer):
            src = os.path.join(tokenizer, name)
            if os.path.isfile(src) and not name.endswith(".safetensors") and name != "config.json":
                shutil.copyfile(src, os.path.join(path, name))
    return path


def offline(args):
    from rtp_llm.tools.bench_gpu import offline as ours_offline
    from rtp_llm.tools.bench_gpu import vllm_offline

    ckpt = write_checkpoint(args.arch, os.path.join(tempfile.gettempdir(), f"rtp_llm_bench_{args.arch}"), args.tokenizer)
    out = lambda r: emit(args.out, dict(r, arch=args.arch, engine=args.engine))  # noqa: E731
    conc = [int(c) for c in args.concurrency.split(",")]
    bw = copy_bandwidth()
    floor = active_weight_bytes(ckpt)
    out({"mode": "floor", "active_weight_bytes": floor, "copy_bandwidth_GBps": bw / 1e9, "tpot_floor_ms": floor / bw * 1e3})
    if args.engine == "ours":
        ours_offline(ckpt, out, max_batch_size=args.max_batch_size, load_format="dummy", concurrency=conc)
    else:
        vllm_offline(ckpt, out, max_batch_size=args.max_batch_size, concurrency=conc,
                     ours_dummy_values=not args.vllm_own_dummy)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["kernel", "offline"])
    p.add_argument("--arch", default="qwen3-30b-a3b", choices=sorted(ARCHS))
    p.add_argument("--tokens", default="1,8,64,256,2048,8192", help="kernel: token counts")
    p.add_argument("--sweep", action="store_true", help="kernel: time every tile configuration")
    p.add_argument("--tuned_out", help="kernel --sweep: write the best per token count here (moe_tuned's JSON; "
                   "RTP_LLM_MOE_TUNED=F uses it)")
    p.add_argument("--engine", default="ours", choices=["ours", "vllm"], help="offline: whose engine")
    p.add_argument("--tokenizer", help="offline: tokenizer files to put beside config.json (the rows send token "
                   "ids: none is needed)")
    p.add_argument("--vllm_own_dummy", action="store_true", help="offline --engine vllm: keep vLLM's own dummy "
                   "values (+-1e-3, one seed for all; its routers tie) instead of refilling ours")
    p.add_argument("--max_batch_size", type=int, default=256)
    p.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)), help="offline: the throughput rows' "
                   "concurrencies")
    p.add_argument("--out")
    args = p.parse_args()
    torch.manual_seed(0)
    (kernel if args.what == "kernel" else offline)(args)


if __name__ == "__main__":
    main()
