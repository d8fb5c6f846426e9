"""How closely a reduced-precision path (bf16, quantized weights) follows the fp32 path's greedy
choices, measured so that the reading does not depend on the machine.

Free-running greedy continuations cannot be compared token for token: after the first position
where the fp32 path's two best tokens are close, the bf16 path may rightly pick the other one,
and from there the texts diverge. Where that first position falls depends on rounding that
differs between CPUs (measured: SmolLM2 Q4_1's first difference moved from token 26 to token 5
on a CPU with AVX512-BF16, at a 0.22-nat fp32 gap). So the bf16 path is teacher-forced: after
each prefix of the fp32 path's own continuation, does it pick the fp32 path's next token? A
broken kernel, block or row order misses almost everywhere (~1/vocab agreement); honest rounding
misses only where the fp32 choice was close, and `misses` says how close."""

from dataclasses import dataclass, field
from typing import List, Tuple

# What a real checkpoint's quantized bf16 path must do (tests/test_*_real_model.py): pick the fp32
# token at this share of the teacher-forced positions at least, and miss only where the fp32
# path's own two best tokens were within this many nats (measured there: 95.7-99.6%, misses at
# gaps up to 0.25; bf16 rounding alone, weights widened, misses at gaps up to 0.15).
REAL_MODEL_SHARE = 0.9
REAL_MODEL_MISS_GAP = 0.5


@dataclass
class ForcedAgreement:
    """share: the fraction of the `positions` teacher-forced positions where the bf16 path picks
    the fp32 path's token. misses: (prompt index, position, fp32 gap) at each other one, the gap
    being the fp32 path's log-prob of its own token minus that of its second best there.
    texts: the bf16 path's own free-running greedy texts of the prompts."""

    share: float
    positions: int
    misses: List[Tuple[int, int, float]] = field(default_factory=list)
    texts: List[str] = field(default_factory=list)

    @property
    def widest_miss(self) -> float:
        return max((gap for _, _, gap in self.misses), default=0.0)

    def follows_fp32(self, least_share: float = REAL_MODEL_SHARE, widest_gap: float = REAL_MODEL_MISS_GAP) -> bool:
        return self.share >= least_share and self.widest_miss <= widest_gap


def teacher_forced(path: str, prompts, new_tokens: int, label: str, tokenizer_path=None, kv_cache_mem_mb: int = 128,
                   **bf16_args) -> ForcedAgreement:
    """The bf16 path of `path` (bf16_args: its extra LLM arguments, e.g. quantization) against the
    fp32 path (every weight widened: a quantized file's reference) over `new_tokens` greedy
    tokens after each of `prompts` (texts or token-id lists), ignore_eos. Prints the reading,
    `label` naming the bf16 side."""
    from rtp_llm.llm import LLM

    def llm(act_type, **kw):
        return LLM(path, tokenizer_path=tokenizer_path, act_type=act_type, progress=False, max_seq_len=512,
                   kv_cache_mem_mb=kv_cache_mem_mb, **kw)

    greedy = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    ref_llm = llm("fp32")
    try:
        ref = [o.outputs[0] for o in ref_llm.generate(prompts, dict(greedy, return_logprobs=True, top_logprobs=2))]
        ids = [p if isinstance(p, list) else ref_llm.encode(p) for p in prompts]
    finally:
        ref_llm.close()
    forced = [p + r.token_ids[:t] for p, r in zip(ids, ref) for t in range(new_tokens)]
    quant = llm("bf16", **bf16_args)
    try:
        got = [o.outputs[0].token_ids[0] for o in quant.generate(forced, {"max_new_tokens": 1, "temperature": 0})]
        texts = [o.outputs[0].text for o in quant.generate(prompts, greedy)]
    finally:
        quant.close()
    misses = []
    for k, token in enumerate(got):
        i, t = divmod(k, new_tokens)
        if token != ref[i].token_ids[t]:
            (_, best), (_, second) = ref[i].top_logprobs[t][:2]
            misses.append((i, t, best - second))
    reading = ForcedAgreement(1 - len(misses) / len(got), len(got), misses, texts)
    print(f"{label}: next tokens equal the fp32 path's at {reading.share:.1%} of {reading.positions} "
          f"teacher-forced positions; misses (prompt, position, fp32 gap) {[(i, t, round(g, 3)) for i, t, g in misses]}")
    return reading
