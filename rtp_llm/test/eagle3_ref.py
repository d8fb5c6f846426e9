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

HEAD_WEIGHTS = "model.safetensors"


def _target_config(target_dir: str) -> dict:
    with open(os.path.join(target_dir, "config.json")) as f:
        return json.load(f)


def _rope_theta(cfg: dict) -> float:
    """transformers 5 writes rope_theta inside rope_parameters; older versions (and published
    checkpoints) write it at the top level; Llama's default applies when neither does."""
    theta = cfg.get("rope_theta")
    if theta is None:
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta")
    return float(theta if theta is not None else 10000.0)


def write_eagle3_head(path: str, target_dir: str, seed: int = 0, draft_vocab: Optional[int] = None,
                      aux_layers: Optional[Sequence[int]] = None, scale: float = 0.2) -> str:
    """Writes a random EAGLE-3 head for the HF checkpoint in target_dir into `path` (config.json
    and model.safetensors, fp32) and returns path.

    Names and shapes are those of published heads, so the engine's loader is exercised on the
    real layout: midlayer.* (q/k/v read 2H), fc [H, 3H], norm, lm_head over the draft vocabulary,
    d2t (target id = draft id + d2t[draft id]) and t2d (which target ids are drafted). There is
    no embed_tokens: the head borrows the target's embedding table. With draft_vocab < vocab the
    draft vocabulary is a random sorted subset of target ids, so d2t is non-trivial; aux_layers,
    when given, is written as eagle_config.eagle_aux_hidden_state_layer_ids (otherwise readers
    fall back to (2, L // 2, L - 3)). Matrices are N(0, scale), large enough that argmaxes are
    decisive; norm weights 1 + 0.1 N(0, 1) so a mixed-up norm shows up in the drafts."""
    from safetensors.torch import save_file

    t = _target_config(target_dir)
    hidden, heads = t["hidden_size"], t["num_attention_heads"]
    kv_heads = t.get("num_key_value_heads") or heads
    head_dim = t.get("head_dim") or hidden // heads
    inter, vocab = t["intermediate_size"], t["vocab_size"]
    draft_vocab = vocab if draft_vocab is None else int(draft_vocab)
    if not 0 < draft_vocab <= vocab:
        raise ValueError(f"draft_vocab {draft_vocab} must be in 1..{vocab}")

    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "intermediate_size": inter, "rms_norm_eps": t.get("rms_norm_eps", 1e-6),
        "rope_theta": _rope_theta(t), "max_position_embeddings": t.get("max_position_embeddings", 2048),
        "vocab_size": vocab, "draft_vocab_size": draft_vocab, "num_hidden_layers": 1,
        "tie_word_embeddings": False, "hidden_act": "silu",
    }
    if aux_layers is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [int(x) for x in aux_layers]}

    gen = torch.Generator().manual_seed(seed)

    def mat(*shape):
        return torch.randn(*shape, generator=gen) * scale

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    m = "midlayer."
    w = {
        m + "input_layernorm.weight": norm(hidden),
        m + "hidden_norm.weight": norm(hidden),
        m + "post_attention_layernorm.weight": norm(hidden),
        m + "self_attn.q_proj.weight": mat(heads * head_dim, 2 * hidden),
        m + "self_attn.k_proj.weight": mat(kv_heads * head_dim, 2 * hidden),
        m + "self_attn.v_proj.weight": mat(kv_heads * head_dim, 2 * hidden),
        m + "self_attn.o_proj.weight": mat(hidden, heads * head_dim),
        m + "mlp.gate_proj.weight": mat(inter, hidden),
        m + "mlp.up_proj.weight": mat(inter, hidden),
        m + "mlp.down_proj.weight": mat(hidden, inter),
        "norm.weight": norm(hidden),
        "fc.weight": mat(hidden, 3 * hidden),
        "lm_head.weight": mat(draft_vocab, hidden),
    }
    if draft_vocab < vocab:
        ids = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    else:
        ids = torch.arange(vocab)
    w["d2t"] = (ids - torch.arange(draft_vocab)).to(torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    w["t2d"] = t2d

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_file({k: v.contiguous() for k, v in w.items()}, os.path.join(path, HEAD_WEIGHTS), metadata={"format": "pt"})
    return path


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
    w = {n: (t.float() if t.is_floating_point() else t) for n, t in load_file(os.path.join(head_dir, HEAD_WEIGHTS)).items()}

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
