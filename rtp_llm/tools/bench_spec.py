"""Speculative decoding, with and without (a tool, not a test): engine steps
(iter_count per stream) and TPOT on a copy-style prompt and a plain one, at batch 1 and 16, and
whether the greedy text came out the same (sampled, --temperature > 0: rejection sampling keeps
the distribution, not the draws, so the column reads n/a). Both engines are loaded side by side
and each point runs --repeats times alternating between them (TPOT: the median), so a machine
whose speed drifts affects both alike; "wasted" is the drafted rows rejected per generated
token (the compute drafting adds: what costs where a step is compute-bound).

Drafters: prompt lookup (--sp_type ngram), a draft model (--sp_type vanilla
--sp_checkpoint_path DRAFT), or an EAGLE-3 head (--sp_type eagle3 --sp_checkpoint_path HEAD; without
HEAD, a random head for the target, --draft_vocab tokens). Random weights accept nothing: --force_accept R (benchmark only,
draft_model.FORCE_ACCEPT_ENV) makes each draft kept with probability R whatever the target
samples, so the speed at that acceptance rate is measured (the text is then not the model's).

    python -m rtp_llm.tools.bench_spec --checkpoint PATH [--act_type bf16] [--batch 1,16] [--repeats 3]
        [--temperature 0.7] [--sp_type vanilla --sp_checkpoint_path DRAFT [--force_accept 0.7]]
        [--device cuda --load_format dummy]
    python -m rtp_llm.tools.bench_spec --arch qwen3-8b --draft_arch qwen3-0.6b --tokenizer DIR --device cuda
        --force_accept 0.7   (random weights of named architectures: random_checkpoint.ARCHS)
    python -m rtp_llm.tools.bench_spec --arch qwen3-8b --sp_type eagle3 --tokenizer DIR --device cuda
        --force_accept 0.7
"""

import argparse
import json
import os
import statistics
import tempfile
import time

from rtp_llm.async_decoder_engine.draft_model import force_accept_for_benchmark
from rtp_llm.config.speculative import SpeculativeConfig
from rtp_llm.llm import LLM

PASSAGE = ("def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
           "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
           "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n")
PROMPTS = {
    "copy": f"Rename the function merge to merge_sorted and keep everything else:\n{PASSAGE}\nResult:\n",
    "plain": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def measure(llm, prompt, batch, new_tokens, temperature=0.0, top_p=1.0):
    config = {"max_new_tokens": new_tokens, "temperature": temperature, "top_p": top_p, "ignore_eos": True}
    t0 = time.perf_counter()
    outs = llm.generate([prompt] * batch, config)
    wall = time.perf_counter() - t0
    tpot = statistics.mean((o.aux_info["cost_time"] - o.aux_info["first_token_cost_time"])
                           / max(o.aux_info["output_len"] - 1, 1) for o in outs)
    steps = statistics.mean(o.aux_info["iter_count"] for o in outs)
    return [o.outputs[0].token_ids for o in outs], steps, tpot, wall


def measure_wasted(llm, prompt, batch, new_tokens, temperature, top_p):
    """measure(), and the rejected drafted rows per generated token (0 without drafts)."""
    before = llm.engine.core.stats()
    out = measure(llm, prompt, batch, new_tokens, temperature, top_p)
    after = llm.engine.core.stats()
    drafted, accepted, generated = (after[k] - before[k] for k in
                                    ("spec_draft_tokens", "spec_accepted_tokens", "generated_tokens"))
    return out + ((drafted - accepted) / max(generated, 1),)


def random_weights(a) -> None:
    """--arch / --draft_arch: config-only checkpoints (random_checkpoint.write_config) in the temp
    directory, loaded with --load_format dummy; --sp_type eagle3 without a head: a random head for
    the target (random_checkpoint.write_eagle3_head, written once)."""
    from rtp_llm.tools.random_checkpoint import hf_dims, write_config, write_eagle3_head

    for arch, field in ((a.arch, "checkpoint"), (a.draft_arch, "sp_checkpoint_path")):
        if arch:
            setattr(a, field, write_config(arch, os.path.join(tempfile.gettempdir(), f"rtp_llm_spec_{arch}"),
                                           a.tokenizer))
            a.load_format = "dummy"
    if a.draft_arch:
        a.sp_type = "vanilla"
    if a.sp_type == "eagle3" and not a.sp_checkpoint_path and a.checkpoint:
        config = os.path.join(a.checkpoint, "config.json")
        if os.path.exists(config):
            with open(config) as f:
                target = json.load(f)
        else:  # a GGUF file
            from rtp_llm.model_loader import load_model

            target = hf_dims(load_model(a.checkpoint, progress=False, tokenizer=False).config)
        name = a.arch or os.path.basename(os.path.normpath(a.checkpoint))
        a.sp_checkpoint_path = write_eagle3_head(
            os.path.join(tempfile.gettempdir(), f"rtp_llm_spec_{name}_eagle3_{a.draft_vocab}"), target,
            draft_vocab=min(a.draft_vocab, target["vocab_size"]), scale=0.02)
    if not a.checkpoint:
        raise SystemExit("bench_spec: --checkpoint or --arch is required")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="the target model (or --arch)")
    p.add_argument("--arch", help="random weights of this architecture (random_checkpoint.ARCHS): the target")
    p.add_argument("--draft_arch", help="random weights of this architecture: the draft model (--sp_type vanilla)")
    p.add_argument("--tokenizer", help="the tokenizer directory copied beside --arch / --draft_arch's configs")
    p.add_argument("--act_type", default="bf16")
    p.add_argument("--batch", default="1,16")
    p.add_argument("--new_tokens", type=int, default=96)
    p.add_argument("--gen_num_per_cycle", default="5", help="drafts per step; several (3,4) load an engine each")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top_p", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sp_draft_pace", default=SpeculativeConfig.sp_draft_pace,
                   help="adaptive or fixed (SpeculativeConfig.sp_draft_pace); both (adaptive,fixed) load an engine each")
    p.add_argument("--sp_type", choices=("ngram", "vanilla", "eagle3"), default="ngram")
    p.add_argument("--sp_checkpoint_path", default="", help="the draft model (--sp_type vanilla) or head (eagle3)")
    p.add_argument("--draft_vocab", type=int, default=32000, help="a random EAGLE-3 head's vocabulary (--arch)")
    p.add_argument("--force_accept", type=float, default=0.0,
                   help="benchmark only: keep each draft with this probability (random weights)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--load_format", default="auto", help="dummy: random weights of the checkpoints' shapes")
    p.add_argument("--kv_cache_mem_mb", type=int, default=4096,
                   help="each engine's KV cache (the engines are loaded at once: a GPU's default would not fit two)")
    a = p.parse_args(argv)
    random_weights(a)
    force_accept_for_benchmark(a.force_accept)
    drafts = [int(d) for d in str(a.gen_num_per_cycle).split(",")]
    paces = str(a.sp_draft_pace).split(",")
    specs = {"off": SpeculativeConfig(),
             **{f"{a.sp_type}/{d}" + (f"/{pace}" if len(paces) > 1 else ""):
                SpeculativeConfig(a.sp_type, d, sp_checkpoint_path=a.sp_checkpoint_path, sp_draft_pace=pace)
                for d in drafts for pace in paces}}
    llms = {}
    try:
        for label, spec in specs.items():
            llms[label] = LLM(a.checkpoint, act_type=a.act_type, progress=False, max_seq_len=1024,
                              kv_cache_mem_mb=a.kv_cache_mem_mb, speculative=spec, device=a.device,
                              load_format=a.load_format)
            llms[label].generate("warm up", {"max_new_tokens": 4, "temperature": 0})
        runs = {}
        for name, prompt in PROMPTS.items():
            for batch in map(int, a.batch.split(",")):
                for _ in range(a.repeats):
                    for label, llm in llms.items():
                        runs.setdefault((label, name, batch), []).append(
                            measure_wasted(llm, prompt, batch, a.new_tokens, a.temperature, a.top_p))
    finally:
        for llm in llms.values():
            llm.close()
    print(f"{'prompt':<6} {'batch':>5} {'drafter/k[/pace]':>16} | {'steps off':>9} {'steps on':>9} {'ratio':>6} | "
          f"{'TPOT off ms':>11} {'TPOT on ms':>10} {'speedup':>7} | {'wasted':>6} | same text")
    for sp in list(specs)[1:]:
        for name in PROMPTS:
            for batch in map(int, a.batch.split(",")):
                off, on = runs["off", name, batch], runs[sp, name, batch]
                p0, p1 = (statistics.median(r[2] for r in rs) for rs in (off, on))
                s0, s1 = off[0][1], on[0][1]
                same = (all(r[0] == off[0][0] for r in off + on) if a.temperature == 0 and not a.force_accept
                        else "n/a")
                print(f"{name:<6} {batch:>5} {sp:>16} | {s0:>9.1f} {s1:>9.1f} {s0 / s1:>6.2f} | {p0:>11.1f} "
                      f"{p1:>10.1f} {p0 / p1:>7.2f} | {on[0][4]:>6.2f} | {same}")


if __name__ == "__main__":
    main()
