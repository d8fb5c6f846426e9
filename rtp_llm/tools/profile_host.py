"""Where the engine loop's host time goes, per step, offline: the phases of
rtp_llm/async_decoder_engine/host_profile.py (the runner's stage / forward / fill_mask / sample /
commit, the device wait, the mask wait, the matchers' advance, the core's schedule and commit),
for B streams of N new tokens, unconstrained and then every stream under a JSON schema
(bench_serve's "long" one by default, which never closes). The server logs the same per burst
of load with --host_profile.

    python -m rtp_llm.tools.profile_host --checkpoint DIR [--device cuda] [--act_type bf16] [--batch 64]
        [--new_tokens 256] [--prompt_len 128] [--temperature 0] [--json_schema FILE | --no_schema]
        [--load_format dummy] [--sp_type eagle3 --sp_checkpoint_path HEAD --gen_num_per_cycle 4
         --sp_draft_pace fixed --force_accept 0.7]

With --sp_type, a speculative round's host time (the drafter's work is in stage and sample);
--force_accept R keeps each draft with probability R (benchmark only: random weights accept none).

The steps run as the server runs them (overlapped where the device runs asynchronously,
CUDA graphs on); nothing is synchronized beyond what the loop itself waits for, so `wait` is
the time the host spent blocked on the device: near zero means the host is the bottleneck.
"""

import argparse
import json
import time

import torch

from rtp_llm.async_decoder_engine.draft_model import force_accept_for_benchmark
from rtp_llm.config.speculative import SpeculativeConfig


def run(llm, prompts, new_tokens, schema, temperature=0.0):
    """(steps, wall seconds, HostProfile.report()) of generating new_tokens for every prompt."""
    from rtp_llm.async_decoder_engine.host_profile import HostProfile
    from rtp_llm.config.generate_config import GenerateConfig

    engine, core = llm.engine, llm.engine.core
    fields = dict(max_new_tokens=new_tokens, temperature=temperature, ignore_eos=True)
    if schema is not None:
        fields["json_schema"] = schema
    cfg = GenerateConfig(**fields).to_proto()
    finished = core.stats()["finished"]
    sids = [core.enqueue(p, cfg) for p in prompts]

    def unadmitted():  # (a stream may end before the last is admitted: a grammar's compile can lag)
        stats = core.stats()
        return len(prompts) - stats["running"] - (stats["finished"] - finished)

    while engine.grammar.compiling() or unadmitted() > 0:  # admitted, prompts run
        engine.step()
    profile = HostProfile(engine)
    try:
        steps, t0 = 0, time.perf_counter()
        while engine.step():
            steps += 1
        wall = time.perf_counter() - t0
    finally:
        profile.detach()
    for sid in sids:
        core.release(sid)
    return steps, wall, profile.report()


def _profiled(path, call, lines=45):
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.runcall(call)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).sort_stats("tottime")
    stats.print_stats(lines)
    stats.print_callers(12)  # (who waits: a sync's callers, by their share of its time)
    with open(path, "w") as f:
        f.write(out.getvalue())


def _device_timeline(path, call, gap_us: float = 2.0, top: int = 15):
    """Runs call under torch.profiler and writes where the device's time went: its busy share of
    the wall time (kernels and copies merged into intervals: the rest it sat idle, waiting for
    the host), its idle gaps longer than gap_us by the device events either side (which host
    work they wait for; the profiler's own host overhead lengthens them) and the kernels by
    total time."""
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        call()
        wall_us = (time.perf_counter() - t0) * 1e6
    spans = sorted((e.time_range.start, e.time_range.end, e.name[:48]) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, end, last = 0.0, float("-inf"), None
    idle, gaps = Counter(), Counter()
    for a, b, name in spans:
        if last is not None and a - end > gap_us:
            idle[(last, name)] += a - end
            gaps[(last, name)] += 1
        if b > end:
            busy += b - max(a, end)
            end, last = b, name
    with open(path, "w") as f:
        f.write(f"device busy {busy / 1e3:.1f} ms of {wall_us / 1e3:.1f} ms wall ({busy / wall_us:.1%}), "
                f"{len(spans)} device events\nidle gaps > {gap_us:g} us, by the events before -> after "
                f"(ms in all, count):\n")
        for (before, after), us in idle.most_common(top):
            f.write(f"  {us / 1e3:8.2f} ms {gaps[(before, after)]:6d}  {before} -> {after}\n")
        f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--tokenizer_path", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--act_type", default="bf16")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt_len", type=int, default=128)
    p.add_argument("--new_tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy, as bench_serve samples")
    p.add_argument("--json_schema", help="a JSON schema file (default: bench_serve's 'long' schema)")
    p.add_argument("--no_schema", action="store_true", help="the unconstrained run only")
    p.add_argument("--cprofile", help="also write the schema run's Python profile (cProfile, by own time) here "
                                      "(with --no_schema: the unconstrained run's)")
    p.add_argument("--device_timeline", help="also write the device's busy share, idle gaps and kernels of a third run (torch.profiler) here")
    p.add_argument("--load_format", default="auto", help="dummy: random weights of the checkpoint's shapes")
    p.add_argument("--sp_type", default="", help="speculative decoding (SpeculativeConfig's flags below)")
    p.add_argument("--sp_checkpoint_path", default="")
    p.add_argument("--gen_num_per_cycle", type=int, default=SpeculativeConfig.gen_num_per_cycle)
    p.add_argument("--sp_draft_pace", default=SpeculativeConfig.sp_draft_pace)
    p.add_argument("--force_accept", type=float, default=0.0, help="benchmark only: keep each draft with this probability")
    a = p.parse_args()
    from rtp_llm.llm import LLM
    from rtp_llm.tools.bench_serve import LONG_SCHEMA

    schema = LONG_SCHEMA
    if a.json_schema:
        with open(a.json_schema) as f:
            schema = json.load(f)
    force_accept_for_benchmark(a.force_accept)
    spec = SpeculativeConfig(a.sp_type, a.gen_num_per_cycle, sp_checkpoint_path=a.sp_checkpoint_path,
                             sp_draft_pace=a.sp_draft_pace)
    llm = LLM(a.checkpoint, tokenizer_path=a.tokenizer_path, act_type=a.act_type, progress=False, device=a.device,
              max_batch_size=a.batch, max_seq_len=a.prompt_len + a.new_tokens + 16, load_format=a.load_format,
              speculative=spec)
    vocab = llm.loaded.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, vocab - 100, (a.batch, a.prompt_len), generator=g).tolist()
    run(llm, prompts[:2], 8, None if a.no_schema else schema)  # warm-up (compiles the grammar)
    for label, s in (("free", None),) + ((("schema", schema),) if not a.no_schema else ()):
        steps, wall, report = run(llm, prompts, a.new_tokens, s, a.temperature)
        profiled = s is not None or a.no_schema  # (the schema run's, or the only one)
        if a.cprofile and profiled:  # a second run, profiled (cProfile slows the Python it times)
            _profiled(a.cprofile, lambda: run(llm, prompts, a.new_tokens, s, a.temperature))
        if a.device_timeline and profiled:
            _device_timeline(a.device_timeline, lambda: run(llm, prompts, a.new_tokens, s, a.temperature))
        print(json.dumps({"case": label, "batch": a.batch, "steps": steps, "step_ms": round(wall / max(steps, 1) * 1e3, 3),
                          "ms_per_token": round(wall / (a.batch * a.new_tokens) * 1e3, 4), **report}))
    llm.close()


if __name__ == "__main__":
    main()
