"""Writes an HF checkpoint with random weights of a named architecture, for benchmarks (speed
does not depend on the values; generate fixed lengths with ignore_eos).

    python -m rtp_llm.tools.random_checkpoint --arch qwen3-0.6b --out DIR [--tokenizer DIR]

The architectures match ../shared/bench/hf_baseline.py's, so both sides time the same model."""

import argparse
import os
import shutil

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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=sorted(ARCHS), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", help="directory whose tokenizer files are copied in (for text prompts)")
    a = p.parse_args()
    print(write(a.arch, a.out, a.tokenizer))


if __name__ == "__main__":
    main()
