"""Tensor parallelism, TP=1 against TP=N on one node (offline API, one GPU per rank with
--device=cuda; gloo ranks on the CPU): greedy tokens of both on the same prompts (in
--check_act_type, fp32 by default: bf16 rounds the partial sums of TP differently), batch-1
TPOT and throughput at a concurrency (in --act_type). Prints JSON lines, then the TPOT ratio
(goal: <= 0.65 at N=2).

    python -m rtp_llm.tools.bench_tp --checkpoint DIR [--arch qwen3-8b] [--device cuda] [--tp 2] \\
        [--concurrency 64] [--prompt_len 128] [--gen_len 128] [--act_type bf16] [--check_act_type fp32]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

from rtp_llm.tools.bench_gpu import random_prompts


def greedy_tokens(ckpt, tp, a) -> list:
    from rtp_llm.llm import LLM

    llm = LLM(ckpt, act_type=a.check_act_type, progress=False, device=a.device, tp_size=tp,
              max_seq_len=a.prompt_len + 48, max_batch_size=4)
    try:
        prompts = random_prompts(llm.loaded.config.vocab_size, 4, a.prompt_len, 1)  # the same on every TP size
        outs = llm.generate(prompts, {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True})
        return [o.outputs[0].token_ids for o in outs]
    finally:
        llm.close()


def measure(ckpt, tp, a) -> dict:
    from rtp_llm.llm import LLM

    llm = LLM(ckpt, act_type=a.act_type, progress=False, device=a.device, tp_size=tp,
              max_seq_len=a.prompt_len + a.gen_len + 16, max_batch_size=max(a.concurrency, 1),
              max_num_batched_tokens=max(2048, a.prompt_len))
    vocab = llm.loaded.config.vocab_size

    def gen(prompts, n):
        t = time.perf_counter()
        outs = llm.generate(prompts, {"max_new_tokens": n, "temperature": 0, "ignore_eos": True})
        return time.perf_counter() - t, [o.outputs[0].token_ids for o in outs]

    try:
        gen(random_prompts(vocab, 2, 16, 0), 4)  # warm-up
        fresh = iter(random_prompts(vocab, 8, a.prompt_len, 2))  # new prompts per run: no prefix-cache hits
        ttft = statistics.median(gen([next(fresh)], 1)[0] for _ in range(3))
        full = statistics.median(gen([next(fresh)], a.gen_len)[0] for _ in range(3))
        seconds, _ = gen(random_prompts(vocab, a.concurrency, a.prompt_len, 3), a.gen_len)
        return {"tp": tp, "tpot_ms": (full - ttft) / (a.gen_len - 1) * 1e3, "ttft_ms": ttft * 1e3,
                "concurrency": a.concurrency, "output_tok_s": a.concurrency * a.gen_len / seconds}
    finally:
        llm.close()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="default: a random checkpoint of --arch")
    p.add_argument("--arch", default="qwen3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--prompt_len", type=int, default=128)
    p.add_argument("--gen_len", type=int, default=128)
    p.add_argument("--act_type", default="bf16")
    p.add_argument("--check_act_type", default="fp32")
    p.add_argument("--only", choices=["tokens", "measure"], help=argparse.SUPPRESS)  # one run, in a child
    a = p.parse_args()
    if a.only:
        out = greedy_tokens(a.checkpoint, a.tp, a) if a.only == "tokens" else measure(a.checkpoint, a.tp, a)
        print("RESULT " + json.dumps(out), flush=True)
        return
    from rtp_llm.tools.random_checkpoint import write

    ckpt = a.checkpoint or write(a.arch, f"/tmp/rtp_llm_bench_{a.arch}")

    def child(only, tp):
        # A process per run: each TP group then starts from a clean process (one group each).
        argv = [sys.executable, "-m", "rtp_llm.tools.bench_tp", "--only", only, "--checkpoint", ckpt, "--tp", str(tp)]
        for k in ("device", "concurrency", "prompt_len", "gen_len", "act_type", "check_act_type"):
            argv += [f"--{k}", str(getattr(a, k))]
        lines = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout.splitlines()
        return json.loads(next(line for line in lines if line.startswith("RESULT "))[7:])

    tokens = [child("tokens", tp) for tp in (1, a.tp)]
    same = tokens[0] == tokens[1]
    if not same:
        first = min(next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), len(p)) for p, q in zip(*tokens))
        print(f"tokens differ from position {first} on", flush=True)
    results = [child("measure", tp) for tp in (1, a.tp)]
    for r in results:
        print(json.dumps(r), flush=True)
    print(f"greedy tokens TP=1 vs TP={a.tp}: {'equal' if same else 'DIFFERENT'} ({a.check_act_type}, 4 x 32); "
          f"TPOT ratio {results[1]['tpot_ms'] / results[0]['tpot_ms']:.2f} (goal <= 0.65 at TP=2)")


if __name__ == "__main__":
    main()
