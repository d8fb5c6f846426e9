"""Prompt log-probs (vLLM's prompt_logprobs; OpenAI completions' echo with logprobs): for each
prompt row of a step (a token whose next token is a prompt token, rtp_llm/cpp/engine/
step_batch_fields.h prompt_targets), the log-prob of that next token and the k most likely
alternatives under the model's raw distribution: the fp32 log-softmax of the logits, with no
penalties, logit_bias, temperature or grammar (vLLM returns raw prompt log-probs too; those
apply to sampling, and the prompt was not sampled). Computed on the device."""

from typing import NamedTuple, Optional

import torch

# Rows per log-softmax: bounds the fp32 temporary to this many rows of the vocabulary
# (a 2048-token prompt chunk of a 152k vocabulary would otherwise take another 1.2 GB).
_ROWS_PER_PASS = 256


class PromptLogprobs(NamedTuple):
    """One step's prompt rows, on the device."""

    logprobs: torch.Tensor                # [P] fp32: each row's target
    top_ids: Optional[torch.Tensor]       # [P, k] int32, best first (None when k is 0)
    top_logprobs: Optional[torch.Tensor]  # [P, k] fp32


@torch.inference_mode()
def prompt_logprobs(logits: torch.Tensor, targets: torch.Tensor, k: int) -> PromptLogprobs:
    """logits: [P, V] fp32 of the prompt rows; targets: [P] int64 token ids; k: alternatives
    per row (0..20)."""
    p = logits.shape[0]
    chosen = torch.empty(p, dtype=torch.float32, device=logits.device)
    top_ids = torch.empty(p, k, dtype=torch.int32, device=logits.device) if k else None
    top_lps = torch.empty(p, k, dtype=torch.float32, device=logits.device) if k else None
    for start in range(0, p, _ROWS_PER_PASS):
        end = min(start + _ROWS_PER_PASS, p)
        lsm = torch.log_softmax(logits[start:end].float(), dim=-1)
        chosen[start:end] = lsm.gather(1, targets[start:end, None]).squeeze(1)
        if k:
            top = lsm.topk(k, dim=-1)
            top_ids[start:end] = top.indices.to(torch.int32)
            top_lps[start:end] = top.values
    return PromptLogprobs(chosen, top_ids, top_lps)
