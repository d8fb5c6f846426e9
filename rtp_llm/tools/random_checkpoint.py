"""Writes an HF checkpoint with random weights of a named architecture, for benchmarks (speed
does not depend on the values; generate fixed lengths with ignore_eos).

    python -m rtp_llm.tools.random_checkpoint --arch qwen3-0.6b --out DIR [--tokenizer DIR]

The architectures match ../shared/bench/hf_baseline.py's, so both sides time the same model.
write_eagle3_head writes a random EAGLE-3 draft head for such a model (bench_spec --sp_type eagle3)."""

import argparse
import json
import os
import shutil
from typing import Optional, Sequence

import torch

ARCHS = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, vocab_size=4096, tie_word_embeddings=True),
}


def _config(arch: str):
    from transformers import Qwen3Config

    return Qwen3Config(max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6, **ARCHS[arch])


def _copy_tokenizer(tokenizer: str, out: str) -> None:
    for name in os.listdir(tokenizer):
        if name.startswith("tokenizer") or name in ("vocab.json", "merges.txt", "special_tokens_map.json"):
            shutil.copy(os.path.join(tokenizer, name), out)


def write(arch: str, out: str, tokenizer: str = None, seed: int = 0) -> str:
    from transformers import Qwen3ForCausalLM

    if os.path.exists(os.path.join(out, "config.json")):
        return out
    torch.manual_seed(seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(dev):
        model = Qwen3ForCausalLM(_config(arch)).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    if tokenizer:
        _copy_tokenizer(tokenizer, out)
    return out


def write_config(arch: str, out: str, tokenizer: str = None) -> str:
    """The architecture's config.json only (and the tokenizer's files): a checkpoint for
    --load_format=dummy, whose weights are made at load."""
    os.makedirs(out, exist_ok=True)
    _config(arch).save_pretrained(out)
    if tokenizer:
        _copy_tokenizer(tokenizer, out)
    return out


def _rope_theta(cfg: dict) -> float:
    """transformers 5 writes rope_theta inside rope_parameters; older versions (and published
    checkpoints) write it at the top level; Llama's default applies when neither does."""
    theta = cfg.get("rope_theta")
    if theta is None:
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta")
    return float(theta if theta is not None else 10000.0)


def hf_dims(c) -> dict:
    """A ModelConfig's shapes under config.json's names (what write_eagle3_head reads of its target):
    for a target without a config.json (a GGUF file)."""
    return {"hidden_size": c.hidden_size, "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim, "intermediate_size": c.intermediate_size, "vocab_size": c.vocab_size,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
            "max_position_embeddings": c.max_position_embeddings}


def write_eagle3_head(path: str, target: dict, seed: int = 0, draft_vocab: Optional[int] = None,
                      aux_layers: Optional[Sequence[int]] = None, scale: float = 0.2,
                      dtype: torch.dtype = torch.bfloat16) -> str:
    """Writes a random EAGLE-3 head for the model of HF config `target` (a dict) into `path`
    (config.json and model.safetensors in `dtype`) and returns path; an existing one is kept.

    Names and shapes are those of published heads, so the engine's loader is exercised on the
    real layout: midlayer.* (q/k/v read 2H), fc [H, 3H], norm, lm_head over the draft vocabulary,
    d2t (target id = draft id + d2t[draft id]) and t2d (which target ids are drafted). There is
    no embed_tokens: the head borrows the target's embedding table. With draft_vocab < vocab the
    draft vocabulary is a random sorted subset of target ids, so d2t is non-trivial; aux_layers,
    when given, is written as eagle_config.eagle_aux_hidden_state_layer_ids (otherwise readers
    fall back to (2, L // 2, L - 3)). Matrices are N(0, scale), large enough that argmaxes are
    decisive; norm weights 1 + 0.1 N(0, 1) so a mixed-up norm shows up in the drafts."""
    from safetensors.torch import save_file

    if os.path.exists(os.path.join(path, "config.json")):
        return path
    t = target
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
    save_file({k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in w.items()}, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=sorted(ARCHS), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", help="directory whose tokenizer files are copied in (for text prompts)")
    a = p.parse_args()
    print(write(a.arch, a.out, a.tokenizer))


if __name__ == "__main__":
    main()
