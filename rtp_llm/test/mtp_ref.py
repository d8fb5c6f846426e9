"""DeepSeek-V3 multi-token-prediction (MTP) fixtures for the engine's speculative-decoding tests: a
random MTP module written into a tiny HF DeepSeek-V3 checkpoint in the layout published V3
checkpoints use (an extra decoder layer `model.layers.{num_hidden_layers}.*` with enorm, hnorm,
eh_proj, shared_head and its own embed_tokens), and the greedy drafts that module proposes,
computed in fp32 from HF transformers' own modules.

HF's DeepseekV3ForCausalLM ignores the MTP layer, so the reference drives it by hand: the main
model's final pre-norm hidden states (captured at the input of model.model.norm), then
e = enorm(embed(t_{i+1})), g = hnorm(h_i), x = eh_proj([e, g]), y = DecoderLayer(x) (transformers'
own DeepseekV3DecoderLayer, sparse like the real MTP layer, so MLA, rope and MoE routing are HF's
code, not ours), logits = shared_head.head(shared_head.norm(y)). It is deliberately naive (every
step recomputes full causal attention over all rows, no KV cache) so that it shares no code and no
shortcuts with the engine: when the engine's drafts differ from these, the engine is what is wrong."""

import json
import os
from typing import Dict, List

import torch

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_MTP_SHARD = "model-mtp.safetensors"


def _config(target_dir: str) -> dict:
    with open(os.path.join(target_dir, "config.json")) as f:
        return json.load(f)


def _tensor_files(target_dir: str) -> Dict[str, str]:
    """{tensor name: safetensors file name} of the checkpoint, sharded (index) or not."""
    from safetensors import safe_open

    index = os.path.join(target_dir, _INDEX)
    if os.path.exists(index):
        with open(index) as f:
            return dict(json.load(f)["weight_map"])
    with safe_open(os.path.join(target_dir, _SINGLE), "pt") as f:
        return {k: _SINGLE for k in f.keys()}


def _load(target_dir: str, names) -> Dict[str, torch.Tensor]:
    """The named tensors, read from whichever shards hold them."""
    from safetensors import safe_open

    files = _tensor_files(target_dir)
    by_file: Dict[str, list] = {}
    for n in names:
        by_file.setdefault(files[n], []).append(n)
    out = {}
    for fname, ns in by_file.items():
        with safe_open(os.path.join(target_dir, fname), "pt") as f:
            out.update({n: f.get_tensor(n) for n in ns})
    return out


def add_mtp_layer(target_dir: str, seed: int = 0, own_embed: bool = True, scale: float = 0.2,
                  head_copy: bool = False) -> str:
    """Writes a random MTP module into the HF DeepSeek-V3 checkpoint at target_dir (a make_tiny
    one) as layer L = num_hidden_layers, named and shaped as in published V3 checkpoints: the
    decoder-layer tensors of the first sparse layer (names and shapes copied, values fresh:
    matrices N(0, scale), norms 1 + 0.1 N(0, 1), e_score_correction_bias N(0, 0.3), as make_tiny
    draws them, so routing and greedy choices are decisive), enorm, hnorm, eh_proj [H, 2H],
    shared_head.norm, shared_head.head [V, H] (random, or with head_copy a copy of the model's LM
    head, as V3 ships it) and, when own_embed, embed_tokens (a copy of the main table, as V3 ships
    it). Sets num_nextn_predict_layers = 1. Returns target_dir."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    cfg = _config(target_dir)
    L, sparse = cfg["num_hidden_layers"], cfg.get("first_k_dense_replace", 0)
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    files = _tensor_files(target_dir)
    assert not any(k.startswith(f"model.layers.{L}.") for k in files), "the checkpoint already has layer L"
    src = f"model.layers.{sparse}."
    template = _load(target_dir, sorted(k for k in files if k.startswith(src)))
    assert any(".mlp.experts." in k for k in template), f"layer {sparse} is not a sparse (MoE) layer"
    main_embed = _load(target_dir, ["model.embed_tokens.weight"])["model.embed_tokens.weight"]
    dtype = main_embed.dtype

    g = torch.Generator().manual_seed(seed)

    def matrix(*shape):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(dtype)

    dst = f"model.layers.{L}."
    new: Dict[str, torch.Tensor] = {}
    for name, t in sorted(template.items()):  # sorted: the same draws for the same seed, however sharded
        rest = name[len(src):]
        if rest.endswith("e_score_correction_bias"):
            v = (torch.randn(t.shape, generator=g) * 0.3).to(t.dtype)
        elif t.dim() >= 2:
            v = (torch.randn(t.shape, generator=g) * scale).to(t.dtype)
        elif rest.endswith(".bias"):
            v = (torch.randn(t.shape, generator=g) * 0.1).to(t.dtype)
        else:
            v = (1.0 + 0.1 * torch.randn(t.shape, generator=g)).to(t.dtype)
        new[dst + rest] = v
    new[dst + "enorm.weight"] = norm(hidden)
    new[dst + "hnorm.weight"] = norm(hidden)
    new[dst + "eh_proj.weight"] = matrix(hidden, 2 * hidden)
    new[dst + "shared_head.norm.weight"] = norm(hidden)
    new[dst + "shared_head.head.weight"] = matrix(vocab, hidden)  # (drawn either way: the same draws after it)
    if head_copy:
        head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings") else "lm_head.weight"
        new[dst + "shared_head.head.weight"] = _load(target_dir, [head])[head].clone()
    if own_embed:
        new[dst + "embed_tokens.weight"] = main_embed.clone()

    index = os.path.join(target_dir, _INDEX)
    if os.path.exists(index):  # sharded: a shard of its own, listed in the index
        save_file(new, os.path.join(target_dir, _MTP_SHARD), metadata={"format": "pt"})
        with open(index) as f:
            idx = json.load(f)
        idx["weight_map"].update({k: _MTP_SHARD for k in new})
        if "total_size" in idx.get("metadata", {}):
            idx["metadata"]["total_size"] += sum(t.numel() * t.element_size() for t in new.values())
        with open(index, "w") as f:
            json.dump(idx, f, indent=2)
    else:
        path = os.path.join(target_dir, _SINGLE)
        with safe_open(path, "pt") as f:
            metadata = f.metadata() or {}
        tensors = load_file(path)
        tensors.update(new)
        save_file(tensors, path, metadata={**metadata, "format": "pt"})
    cfg["num_nextn_predict_layers"] = 1
    with open(os.path.join(target_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return target_dir


# ------------------------------------------------------------------ the naive reference


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def causal_mask(rows: int) -> torch.Tensor:
    """The additive float mask [1, 1, rows, rows] (-inf above the diagonal) that HF's eager
    attention adds to its scores."""
    return torch.full((rows, rows), float("-inf")).triu(1)[None, None]


def run_layer(model, layer, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One HF decoder layer over x [1, rows, H] at integer positions [rows], causal, with the
    main model's rotary embedding (YaRN, attention scaling and all) and no cache: the calling
    convention DeepseekV3Model.forward uses for its own layers."""
    pos = positions[None]
    cos_sin = model.model.rotary_emb(x, pos)
    return layer(x, attention_mask=causal_mask(x.shape[1]), position_ids=pos, position_embeddings=cos_sin)


def _load_hf_layer(model, weights: Dict[str, torch.Tensor], layer_idx: int):
    """transformers' own decoder layer (the class of the main model's layer layer_idx, so sparse
    when that one is) holding `weights` (checkpoint names, prefix stripped); HF's fused expert
    tensors (gate_up_proj [E, 2I, H] = gate then up, down_proj [E, H, I]) are stacked from the
    per-expert ones as its checkpoint converter does."""
    layer = type(model.model.layers[layer_idx])(model.config, layer_idx=layer_idx).float().eval()
    want = layer.state_dict()
    sd = {k: v for k, v in weights.items() if ".experts." not in k or k in want}
    if "mlp.experts.gate_up_proj" in want:
        n = want["mlp.experts.gate_up_proj"].shape[0]
        e = [f"mlp.experts.{i}." for i in range(n)]
        sd["mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([weights[p + "gate_proj.weight"], weights[p + "up_proj.weight"]], 0) for p in e])
        sd["mlp.experts.down_proj"] = torch.stack([weights[p + "down_proj.weight"] for p in e])
    layer.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    return layer


def load_main_model(target_dir: str):
    """HF's fp32 model of the checkpoint with eager attention (plain matmul, softmax and the
    additive mask of causal_mask, no SDPA backend choices). num_key_value_heads is set to
    num_attention_heads: MLA's expand_kv already yields a key and value per query head, so HF's
    repeat_kv must be a no-op; make_tiny's configs keep DeepseekV3Config's default 128 (real V3:
    128 heads, so the same), which leaves eager's num_key_value_groups at 4 // 128 = 0 and its
    keys empty (SDPA skips repeat_kv below 2 groups, which is why the default model runs)."""
    import transformers

    heads = _config(target_dir)["num_attention_heads"]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        target_dir, dtype=torch.float32, attn_implementation="eager", num_key_value_heads=heads)
    model.config._attn_implementation = "eager"
    return model.eval()


def reference_mtp_drafts(target_dir: str, tokens: List[int], k: int) -> List[int]:
    """The k greedy drafts the MTP module of the checkpoint at target_dir proposes after `tokens`
    (the last one the last known token, at position n - 1), in fp32. Row i (positions 0..n-2)
    reads (tokens[i + 1], h_i), h the main model's final pre-norm hidden states; draft 1 is the
    argmax of the row at n - 2; draft j + 1 that of a new row at n - 2 + j reading (draft j, y of
    the row before), y the MTP layer's pre-norm output, as DeepSeek-V3 chains its MTP steps."""
    n = len(tokens)
    assert n >= 2 and k >= 1, "the MTP module needs two known tokens"
    cfg = _config(target_dir)
    L, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    sparse = cfg.get("first_k_dense_replace", 0)  # the first MoE layer's index
    model = load_main_model(target_dir)
    prefix = f"model.layers.{L}."
    names = [k_ for k_ in _tensor_files(target_dir) if k_.startswith(prefix)]
    assert names, f"no MTP layer {L} in {target_dir}"
    w = {name[len(prefix):]: t.float() for name, t in _load(target_dir, names).items()}
    mtp_keys = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")
    layer = _load_hf_layer(model, {kk: v for kk, v in w.items() if not kk.startswith(mtp_keys)}, sparse)
    embed = w.get("embed_tokens.weight", model.model.embed_tokens.weight.detach().float())

    captured = []
    hook = model.model.norm.register_forward_pre_hook(lambda mod, args: captured.append(args[0].detach()))
    try:
        with torch.inference_mode():
            model(torch.tensor([tokens]))
    finally:
        hook.remove()
    h = captured[-1][0].float()  # [n, H], the residual stream after the last layer

    row_tokens, row_hidden, drafts = list(tokens[1:]), [h[i] for i in range(n - 1)], []
    with torch.inference_mode():
        for _ in range(k):
            e = _rmsnorm(embed[torch.tensor(row_tokens)], w["enorm.weight"], eps)
            g = _rmsnorm(torch.stack(row_hidden), w["hnorm.weight"], eps)
            x = torch.cat([e, g], -1) @ w["eh_proj.weight"].T
            y = run_layer(model, layer, x[None], torch.arange(len(row_tokens)))[0]
            logits = _rmsnorm(y[-1], w["shared_head.norm.weight"], eps) @ w["shared_head.head.weight"].T
            drafts.append(int(logits.argmax()))
            row_tokens.append(drafts[-1])
            row_hidden.append(y[-1])
    return drafts
