"""Tiny random-weight HF checkpoints (Qwen3, Qwen2, Llama; GQA, MQA, tied and untied) made
with transformers, for parity tests. Weights are scaled up so that greedy choices are
decisive rather than near-ties."""

import os

import torch

TINY = {
    # name: (transformers config class, kwargs)
    "qwen3_gqa_untied": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                             tie_word_embeddings=False)),
    "qwen2_mqa_tied": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)),
    "llama_gqa_tied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                           rope_theta=100000.0)),
    "llama_mha_untied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=4,
                                             tie_word_embeddings=False)),
}


def overlap_sampling_configs(prompt_tail: int):
    """generate_configs whose tokens must not depend on overlapped scheduling: seeded samples,
    penalties (while such a stream samples the engine steps in turn) and a stop word."""
    return [{"max_new_tokens": 40, "temperature": 0.9, "top_k": 50, "random_seed": 3},
            {"max_new_tokens": 40, "temperature": 0.7, "random_seed": 4, "repetition_penalty": 1.3},
            {"max_new_tokens": 40, "temperature": 0, "stop_words_list": [[prompt_tail]]}]


def make_tiny(name: str, root: str) -> str:
    import transformers

    cls_name, kwargs = TINY[name]
    config = getattr(transformers, cls_name)(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, max_position_embeddings=512,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **kwargs)
    torch.manual_seed(sum(map(ord, name)))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif pname.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:  # norm weights
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    path = os.path.join(root, name)
    model.save_pretrained(path, safe_serialization=True)
    return path
