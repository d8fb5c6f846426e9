"""Offline generation throughput against HF transformers' generate() in the same run (a tool
that prints numbers, not a test).

    python -m rtp_llm.tools.bench_offline --checkpoint PATH [--batch 1,16] [--prompt_len 128]
        [--gen_len 128] [--act_type bf16] [--threads N] [--device cpu|cuda] [--latency]

Both sides get the same random prompts, greedy decoding and exactly gen_len new tokens
(EOS ignored). Reported: output and total tokens/s (batch * gen_len, resp. batch *
(prompt_len + gen_len), over the wall time, prefill included) and the ratio ours / HF.
--latency adds batch-1 TTFT (a 1-token generation) and TPOT ((time of gen_len tokens - TTFT)
/ (gen_len - 1)), medians of --repeats runs. --llamacpp (a .gguf checkpoint) also runs llama.cpp
on the same file with the same thread count (tools/llamacpp_peer.py) after ours, and prints
batch-1 prefill and decode tok/s and the largest batch's output tok/s of both, with ratios."""

import argparse
import os
import statistics
import time

import torch


def load_hf(path: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    if path.endswith(".gguf"):
        model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                     dtype=torch.float32)
        model = model.to(dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.generation_config.eos_token_id = None
    return model.to(device).eval()


def hf_run(model, prompts, gen_len):
    ids = torch.tensor(prompts, device=model.device)
    with torch.inference_mode():
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen_len, min_new_tokens=gen_len,
                             do_sample=False)
        if ids.is_cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t
    assert out.shape[1] - ids.shape[1] == gen_len
    return elapsed


def ours_run(llm, prompts, gen_len):
    t = time.perf_counter()
    outs = llm.generate(prompts, {"max_new_tokens": gen_len, "temperature": 0, "ignore_eos": True})
    elapsed = time.perf_counter() - t
    assert all(len(o.outputs[0].token_ids) == gen_len for o in outs)
    return elapsed


def projection_flops(c, batch: int, prompt_len: int, gen_len: int) -> float:
    """Multiply-add FLOPs of the run's projections and LM head (attention excluded, so a lower
    bound): every prompt token goes through the layers, one per sequence through the LM head
    at prefill; each later token through both."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    body, head = c.num_layers * layer, c.vocab_size * c.hidden_size
    return 2.0 * batch * (prompt_len * body + head + (gen_len - 1) * (body + head))


def best_gemm_gflops(c, dtype: torch.dtype) -> float:
    """The best rate torch's GEMM (oneDNN) reaches here on the model's widest prefill projection
    (2048 tokens x hidden -> 2 x intermediate), in GFLOP/s: what a run built on that GEMM can
    reach. The cores' own peak is higher (cpu_bf16_peak_gflops)."""
    a = torch.randn(2048, c.hidden_size, dtype=dtype)
    b = torch.randn(c.hidden_size, 2 * c.intermediate_size, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2.0 * a.shape[0] * a.shape[1] * b.shape[1] / best / 1e9


def cpu_bf16_peak_gflops() -> float:
    from rtp_llm.ops import ensure_compute_ops_loaded

    return float(ensure_compute_ops_loaded().cpu_bf16_peak_gflops())


def print_latency(args, llm, hf, vocab: int, g: torch.Generator) -> dict:
    """Batch-1 TTFT and TPOT of each side, printed; ours returned as {"ttft", "tpot"} (s)."""
    # A new prompt for every run: a repeated one would be served from our prefix cache.
    def prompt():
        return torch.randint(100, vocab - 100, (1, args.prompt_len), generator=g).tolist()

    sides = [("rtp_llm", lambda n: ours_run(llm, prompt(), n))]
    if hf is not None:
        sides.append(("HF", lambda n: hf_run(hf, prompt(), n)))
    ours = {}
    for name, run in sides:
        run(4)  # warm-up
        ttft = statistics.median(run(1) for _ in range(args.repeats))
        full = statistics.median(run(args.gen_len) for _ in range(args.repeats))
        tpot = (full - ttft) / (args.gen_len - 1)
        print(f"latency {name:>8}: TTFT {ttft * 1e3:8.2f} ms  TPOT {tpot * 1e3:7.3f} ms", flush=True)
        if name == "rtp_llm":
            ours = dict(ttft=ttft, tpot=tpot)
    return ours


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="HF directory or .gguf file")
    p.add_argument("--batch", default="1,16")
    p.add_argument("--prompt_len", type=int, default=128)
    p.add_argument("--gen_len", type=int, default=128)
    p.add_argument("--act_type", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--repeats", type=int, default=1, help="timed runs per side (median reported)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--skip_hf", action="store_true")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--latency", action="store_true", help="also batch-1 TTFT and TPOT")
    p.add_argument("--kv_cache_mem_mb", type=int, help="default: 1024 on the CPU, the backend's default on a GPU")
    p.add_argument("--llamacpp", action="store_true", help="llama.cpp on the same .gguf too (implies --latency)")
    args = p.parse_args()
    if args.llamacpp and not args.checkpoint.endswith(".gguf"):
        p.error("--llamacpp needs a .gguf --checkpoint (llama.cpp runs the same file)")
    args.latency = args.latency or args.llamacpp
    ours = {}  # what --llamacpp compares: "ttft", "tpot" (s), batch -> output tok/s
    if args.threads:
        torch.set_num_threads(args.threads)
    from rtp_llm.llm import LLM
    from rtp_llm.model_loader import parse_dtype

    dtype = parse_dtype(args.act_type)
    batches = [int(b) for b in args.batch.split(",")]
    max_batch = max(batches)
    kv_mb = args.kv_cache_mem_mb or (1024 if args.device == "cpu" else None)
    llm = LLM(args.checkpoint, act_type=args.act_type, progress=False, device=args.device,
              max_seq_len=args.prompt_len + args.gen_len + 16, max_batch_size=max(max_batch, 1),
              max_num_batched_tokens=max(2048, args.prompt_len), kv_cache_mem_mb=kv_mb)
    hf = None if args.skip_hf else load_hf(args.checkpoint, dtype, args.device)
    vocab = llm.loaded.config.vocab_size
    g = torch.Generator().manual_seed(0)
    print(f"model {os.path.basename(args.checkpoint.rstrip('/'))}  device {args.device}  dtype {args.act_type}  "
          f"prompt {args.prompt_len}  gen {args.gen_len}  torch threads {torch.get_num_threads()}")
    if args.latency:
        ours.update(print_latency(args, llm, hf, vocab, g))
    roof = best_gemm_gflops(llm.loaded.config, dtype) if args.device == "cpu" else None
    peak = cpu_bf16_peak_gflops() if roof and dtype == torch.bfloat16 else 0.0
    if roof:
        print(f"compute: {roof:.0f} GFLOP/s (best {args.act_type} GEMM here, torch/oneDNN); 'floor' = the run's "
              "projection FLOPs at that rate, 'max ratio' = HF's time / floor")
    if peak:
        print(f"         {peak:.0f} GFLOP/s (the cores' bf16 multiply-add peak, registers only); 'peak max' = HF's "
              "time / the projection FLOPs at that rate: what no engine can exceed here")
    print(f"{'batch':>5} {'rtp_llm out tok/s':>18} {'total tok/s':>12} {'HF out tok/s':>13} {'ratio':>7}"
          + (f" {'floor s':>8} {'max ratio':>9}" if roof else "") + (f" {'peak max':>9}" if peak else ""))
    for batch in batches:
        # Each repeat gets new prompts (repeated ones would hit our prefix cache); both sides
        # get the same ones.
        runs = [torch.randint(100, vocab - 100, (batch, args.prompt_len), generator=g).tolist()
                for _ in range(args.repeats)]
        prompts = runs[0]
        ours_run(llm, [q[:8] for q in prompts], 4)  # warm-up
        ours_s = statistics.median(ours_run(llm, r, args.gen_len) for r in runs)
        ours_tps = batch * args.gen_len / ours_s
        total_tps = batch * (args.prompt_len + args.gen_len) / ours_s
        ours[batch] = ours_tps
        flops = projection_flops(llm.loaded.config, batch, args.prompt_len, args.gen_len)
        floor = flops / (roof * 1e9) if roof else None
        if hf is None:
            print(f"{batch:>5} {ours_tps:>18.1f} {total_tps:>12.1f} {'-':>13} {'-':>7}"
                  + (f" {floor:>8.2f} {'-':>9}" if roof else "") + (f" {'-':>9}" if peak else ""), flush=True)
            continue
        hf_run(hf, [q[:8] for q in prompts], 4)
        ref = statistics.median(hf_run(hf, r, args.gen_len) for r in runs)
        hf_tps = batch * args.gen_len / ref
        bound = (f" {floor:>8.2f} {ref / floor:>8.2f}x" if roof else "") + (
            f" {ref * peak * 1e9 / flops:>8.2f}x" if peak else "")
        print(f"{batch:>5} {ours_tps:>18.1f} {total_tps:>12.1f} {hf_tps:>13.1f} {ours_tps / hf_tps:>6.2f}x{bound}",
              flush=True)
    llm.close()
    if args.llamacpp:
        print_llamacpp(args, ours, max_batch)


def print_llamacpp(args, ours: dict, batch: int):
    """llama.cpp on the same file, after ours (never beside it: they would share the cores)."""
    from rtp_llm.tools.llamacpp_peer import measure

    peer = measure(args.checkpoint, torch.get_num_threads(), args.prompt_len, args.gen_len, batch, max(args.repeats, 1))
    rows = [("batch-1 prefill tok/s", args.prompt_len / ours["ttft"], peer.prefill_tps),
            ("batch-1 decode tok/s", 1 / ours["tpot"], peer.decode_tps),
            (f"batch-{batch} output tok/s", ours[batch], peer.batch_out_tps)]
    print(f"llama.cpp (same file, {torch.get_num_threads()} threads; tools/llamacpp_peer.py)")
    print(f"{'':>24} {'rtp_llm':>10} {'llama.cpp':>10} {'ratio':>7}")
    for label, a, b in rows:
        print(f"{label:>24} {a:>10.1f} {b:>10.1f} {a / b:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
