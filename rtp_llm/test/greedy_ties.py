"""Greedy parity that knows a near-tie when it meets one.

Two fp32 implementations that sum in different orders (whole prompts against chunks of 16, ours
against HF) may pick different tokens where the reference's two best log-probs differ by less
than the rounding between them (measured: 7e-6 apart in a tiny DeepSeek-V3 at token 28); after
such a position the continuations rightly diverge. Any other difference is a real mismatch."""

import torch

# Log-prob gap below which two tokens are a tie for fp32 parity (the fixtures' decisive choices
# are orders of magnitude apart; summation-order noise in fp32 is ~1e-6).
TIE_LOGPROB = 1e-4


def first_real_mismatch(hf, prompt, ours, ref, logprobs_fn):
    """None when `ours` equals `ref` (HF's greedy tokens after `prompt`) up to their first
    difference and that difference is a near-tie under HF's log-probs at that position; else a
    message naming the position, both tokens and their log-probs. logprobs_fn(hf, ids): HF's
    [len(ids), vocab] log-probs (testlib.hf_logprobs)."""
    k = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    if k is None:
        return None if len(ours) == len(ref) else f"{len(ours)} tokens against HF's {len(ref)}"
    lp = logprobs_fn(hf, list(prompt) + list(ref[:k]))[-1]
    gap = float(lp[ref[k]] - lp[ours[k]])
    if gap <= TIE_LOGPROB:
        return None
    return (f"token {k}: ours {ours[k]} (log-prob {float(lp[ours[k]]):.6f}), HF's {ref[k]} "
            f"({float(lp[ref[k]]):.6f}): {gap:.2e} apart, not a tie")


def assert_greedy_equal_up_to_ties(case, hf, prompts, ours, refs, logprobs_fn):
    """case.fail()s on the first prompt whose tokens differ from HF's other than at a near-tie."""
    with torch.inference_mode():
        for i, (prompt, o, r) in enumerate(zip(prompts, ours, refs)):
            why = first_real_mismatch(hf, prompt, o, r, logprobs_fn)
            if why:
                case.fail(f"prompt {i}: {why}\nours {o}\nHF   {r}")
