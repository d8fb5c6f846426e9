"""Where a step's time goes: times prefill and decode steps of the engine (wall clock per
step, with the device synchronized) and prints torch.profiler's kernel table for them.

    python -m rtp_llm.tools.profile_step --checkpoint DIR --device cuda [--prompt_len 1024]
        [--batch 1] [--decode_steps 32] [--no_cuda_graph] [--no_overlap] [--tp N] [--trace out.json]
        [--load_format dummy]

--tp N profiles rank 0 of a tensor-parallel group (its kernels, collectives included, on its GPU).
Step times synchronize the device after every step, so they show a step's own time, not the
overlap of one step's host work with the previous step's kernels.
"""

import argparse
import time

import torch

from rtp_llm.config.model_config import LOAD_FORMATS


def _steps(llm, prompts, new_tokens):
    """Enqueues, then steps until done; returns (first step's seconds, later steps' seconds)."""
    from rtp_llm.config.generate_config import GenerateConfig

    core, engine = llm.engine.core, llm.engine
    cfg = GenerateConfig(max_new_tokens=new_tokens, temperature=0, ignore_eos=True).to_proto()
    sids = [core.enqueue(p, cfg) for p in prompts]
    times = []
    while True:
        t = time.perf_counter()
        if not engine.step():
            break
        engine.backend.synchronize() if hasattr(engine.backend, "synchronize") else None
        times.append(time.perf_counter() - t)
    for sid in sids:
        core.release(sid)
    return times[0], times[1:]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--act_type", default="bf16")
    p.add_argument("--load_format", default="auto", choices=LOAD_FORMATS,
                   help="dummy: random weights from the checkpoint's config.json (a directory with only that)")
    p.add_argument("--prompt_len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--decode_steps", type=int, default=32)
    p.add_argument("--no_cuda_graph", action="store_true")
    p.add_argument("--no_overlap", action="store_true", help="steps in turn (no overlapped scheduling)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--rows", type=int, default=25, help="rows of the kernel table")
    p.add_argument("--trace", help="write a Chrome trace of the profiled steps")
    a = p.parse_args()
    from rtp_llm.llm import LLM

    llm = LLM(a.checkpoint, act_type=a.act_type, progress=False, device=a.device, cuda_graph=not a.no_cuda_graph,
              tp_size=a.tp, overlap_schedule=False if a.no_overlap else None,
              max_seq_len=a.prompt_len + a.decode_steps + 16, max_batch_size=max(a.batch, 1),
              max_num_batched_tokens=max(2048, a.prompt_len * a.batch), load_format=a.load_format)
    vocab = llm.loaded.config.vocab_size
    g = torch.Generator().manual_seed(0)

    def fresh():  # new prompts for every run: a repeated one would be served from the prefix cache
        return torch.randint(100, vocab - 100, (a.batch, a.prompt_len), generator=g).tolist()

    _steps(llm, fresh(), 4)  # warm-up
    first, rest = _steps(llm, fresh(), a.decode_steps + 1)
    rest.sort()
    print(f"batch {a.batch}, prompt {a.prompt_len}: prefill step {first * 1e3:.2f} ms; decode step median "
          f"{rest[len(rest) // 2] * 1e3:.3f} ms (min {rest[0] * 1e3:.3f}, {len(rest)} steps)")
    acts = [torch.profiler.ProfilerActivity.CPU]
    if a.device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        _steps(llm, fresh(), a.decode_steps + 1)
    sort = "cuda_time_total" if a.device == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=a.rows, max_name_column_width=60))
    if a.trace:
        prof.export_chrome_trace(a.trace)
    llm.close()


if __name__ == "__main__":
    main()
