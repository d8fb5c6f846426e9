"""EAGLE-3 fixtures for the engine's speculative-decoding tests: a random draft head written in
the checkpoint layout that published EAGLE-3 heads use (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B,
AngelSlim/Qwen3-8B_eagle3, ...), and the greedy drafts such a head proposes, computed in plain
fp32 torch from the HF target and the head's safetensors.

The reference is deliberately naive (every step recomputes full causal attention over all rows,
no KV cache, no fused kernels) so that it shares no code and no shortcuts with the engine: when
the engine's drafts differ from these, the engine is what is wrong. It follows the EAGLE-3 head
as vLLM and SGLang run it (LlamaForCausalLMEagle3): one decoder layer whose attention reads
[norm(embedding), norm(hidden)] (2H wide), fed the target's auxiliary hidden states through fc
on the first pass and its own pre-norm output on later passes."""

import json
import os
from typing import List, Optional, Sequence

import torch

# The tests' EAGLE-3 target (testlib.make_tiny's spec, as "qwen3_4layers"): a tiny Qwen3 with the
# 4 layers the head's default aux layers (2, L/2, L-3) need, and its own LM head.
EAGLE_TARGET = ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                    tie_word_embeddings=False, num_hidden_layers=4))

def _target_config(target_dir: str) -> dict:
    with open(os.path.join(target_dir, "config.json")) as f:
        return json.load(f)


def write_eagle3_head(path: str, target_dir: str, seed: int = 0, draft_vocab: Optional[int] = None,
                      aux_layers: Optional[Sequence[int]] = None, scale: float = 0.2) -> str:
    """A random fp32 EAGLE-3 head for the HF checkpoint in target_dir (random_checkpoint.write_eagle3_head,
    the benchmarks' writer: the layout of published heads, N(0, scale) matrices, norms near 1)."""
    from rtp_llm.tools.random_checkpoint import write_eagle3_head as write

    return write(path, _target_config(target_dir), seed, draft_vocab, aux_layers, scale, torch.float32)


# ------------------------------------------------------------------ the naive reference


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's rotate_half rotary on x [heads, rows, D] at integer positions pos [rows]: the
    first and second halves of each head are the pair's two coordinates (not interleaved)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    freqs = pos.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention, q [heads, rows, D], k and v [kv_heads, rows, D] (GQA: query
    head i reads kv head i // (heads // kv_heads), as HF's repeat_kv arranges them); returns
    [rows, heads * D]."""
    heads, rows, d = q.shape
    rep = heads // k.shape[0]
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    scores = (q @ k.transpose(1, 2)) * d ** -0.5
    mask = torch.ones(rows, rows, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    out = scores.softmax(-1) @ v
    return out.transpose(0, 1).reshape(rows, heads * d)


def _head_forward(w: dict, cfg: dict, emb: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The head's decoder layer over rows at positions 0..rows-1, each row attending to itself
    and all earlier rows: emb [rows, H] the input tokens' embeddings, g [rows, H] the hidden fed
    in (already through fc where it came from the target). Returns the pre-norm output h."""
    m, eps = "midlayer.", cfg["rms_norm_eps"]
    heads, kv_heads, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    rows, theta = emb.shape[0], float(cfg.get("rope_theta", 10000.0))
    x = torch.cat([_rmsnorm(emb, w[m + "input_layernorm.weight"], eps),
                   _rmsnorm(g, w[m + "hidden_norm.weight"], eps)], -1)

    def proj(name, n):
        return (x @ w[m + f"self_attn.{name}_proj.weight"].T).view(rows, n, d).transpose(0, 1)

    pos = torch.arange(rows)
    q, k, v = _rope(proj("q", heads), pos, theta), _rope(proj("k", kv_heads), pos, theta), proj("v", kv_heads)
    h = g + _attend(q, k, v) @ w[m + "self_attn.o_proj.weight"].T
    y = _rmsnorm(h, w[m + "post_attention_layernorm.weight"], eps)
    gate = torch.nn.functional.silu(y @ w[m + "mlp.gate_proj.weight"].T)
    return h + (gate * (y @ w[m + "mlp.up_proj.weight"].T)) @ w[m + "mlp.down_proj.weight"].T


def aux_layer_ids(head_cfg: dict, num_layers: int) -> List[int]:
    """The target layers whose inputs feed the head: the head config's
    eagle_config.eagle_aux_hidden_state_layer_ids, else vLLM's and SGLang's default."""
    ids = (head_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if ids else [2, num_layers // 2, num_layers - 3]


@torch.inference_mode()
def reference_drafts(target_dir: str, head_dir: str, tokens: list, k: int) -> list:
    """The k greedy drafts the EAGLE-3 head in head_dir proposes after `tokens` (ids; the last
    is the last known token, at position n-1), as target ids.

    The target runs once (HF, fp32) to give aux_i = cat of the residual streams entering the
    aux layers at position i. Head row i (i = 0..n-2) reads token i+1 and fc(aux_i), so row n-2
    (last known token, hidden of position n-2) gives draft 1; each further draft comes from a new
    row whose input is the previous draft and whose hidden is the previous row's pre-norm output
    (not through fc), attending to all rows before it."""
    import transformers
    from safetensors.torch import load_file

    tokens = [int(t) for t in tokens]
    if len(tokens) < 2:
        raise ValueError("reference_drafts needs at least two tokens")
    with open(os.path.join(head_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    stored = load_file(os.path.join(head_dir, "model.safetensors"))
    w = {n: (t.float() if t.is_floating_point() else t) for n, t in stored.items()}

    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    ids = torch.tensor([tokens])
    out = model(input_ids=ids, output_hidden_states=True)
    layers = aux_layer_ids(cfg, model.config.num_hidden_layers)
    aux = torch.cat([out.hidden_states[l][0] for l in layers], -1)  # [n, 3H]
    embed = model.get_input_embeddings().weight.float()

    hidden = cfg["hidden_size"]
    fed = aux[:-1] @ w["fc.weight"].T if aux.shape[-1] == 3 * hidden else aux[:-1]
    row_tokens, row_hidden = tokens[1:], [fed[i] for i in range(fed.shape[0])]
    d2t = w["d2t"]
    drafts: List[int] = []
    for _ in range(k):
        h = _head_forward(w, cfg, embed[torch.tensor(row_tokens)], torch.stack(row_hidden))
        logits = _rmsnorm(h[-1], w["norm.weight"], cfg["rms_norm_eps"]) @ w["lm_head.weight"].T
        d = int(logits.argmax())
        drafts.append(d + int(d2t[d]))
        row_tokens.append(drafts[-1])
        row_hidden.append(h[-1])
    return drafts


def generate_recording_drafts(llm, prompts, config: dict):
    """(llm.generate(prompts, config), proposals): each draft proposal the engine's EAGLE-3 drafter
    wrote into a step's batch, as (stream id, position of the stream's last known token, drafts)."""
    from unittest import mock

    from rtp_llm.async_decoder_engine import eagle_drafter

    proposals = []
    real = eagle_drafter.EagleDrafter.propose

    def record(drafter, b, drafting):
        on_device = real(drafter, b, drafting)  # (DeviceDrafts, or None: written into b.token_ids)
        tokens = b.token_ids.copy()
        if on_device is not None:
            tokens[on_device.at] = on_device.values.cpu().numpy()
        d = b.draft_lens[drafting]
        first = b.query_starts[drafting + 1] - 1 - d
        for i, f, n in zip(b.stream_ids[drafting], first, d):
            proposals.append((int(i), int(b.positions[f]), tokens[f + 1:f + 1 + n].tolist()))
        return on_device
    with mock.patch.object(eagle_drafter.EagleDrafter, "propose", record):
        return llm.generate(prompts, config), proposals


def draft_mismatches(reference, prompts, outs, proposals) -> list:
    """The proposals (generate_recording_drafts') that differ from reference(tokens, k) (e.g.
    reference_drafts with its checkpoints bound) over the stream's tokens up to its last known
    one, as (proposal, reference); streams are numbered in submission order, one per prompt."""
    ids = sorted({i for i, _, _ in proposals})
    assert len(ids) == len(prompts), (ids, len(prompts))
    bad = []
    for i, pos, drafts in proposals:
        k = ids.index(i)
        seq = list(prompts[k]) + list(outs[k].outputs[0].token_ids)
        ref = reference(seq[:pos + 1], len(drafts))
        if drafts != ref:
            bad.append(((i, pos, drafts), ref))
    return bad


def assert_head_drafts(llm, reference, prompts, new_tokens: int, greedy=None) -> None:
    """Generates new_tokens greedily for prompts on `llm` (an engine drafting with a head; closed
    after) and checks its run: every proposal equal to reference(tokens, k)'s, no KV block left in
    use, and the plain greedy tokens greedy(prompt) (e.g. HF's), or where greedy is None (drafts
    forced through) some drafts but not all accepted."""
    try:
        outs, proposals = generate_recording_drafts(llm, prompts, {"max_new_tokens": new_tokens, "temperature": 0,
                                                                   "ignore_eos": True})
        stats = llm.engine.core.stats()
    finally:
        llm.close()
    if greedy is None:
        assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"], stats
    else:
        for prompt, out in zip(prompts, outs):
            assert out.outputs[0].token_ids == greedy(prompt), len(prompt)
    assert proposals and draft_mismatches(reference, prompts, outs, proposals) == []
    assert stats["used_blocks"] == 0
