"""--quantization=int8 on a real model: Qwen2.5-Coder-0.5B's Q4_K_M file. Whatever of it the
loader widens to floating point is quantized to int8 blocks (model_loader/quantize_at_load.py)
next to the formats the file keeps, so every projection computes quantized, and the answer
stays the right one."""

import torch

from rtp_llm.llm import LLM


def test_int8_at_load_keeps_the_answer(qwen25):
    llm = LLM(qwen25, act_type="bf16", quantization="int8", progress=False, max_seq_len=256,
              kv_cache_mem_mb=64)
    try:
        prompt = llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France? Answer in one word."}], tokenize=False,
            add_generation_prompt=True)
        out = llm.generate([prompt], {"max_new_tokens": 8, "temperature": 0})[0].outputs[0]
        assert "Paris" in out.text, out.text
        model = llm.engine.runner.model
        packed = [w for l in model.layers for w in (l.qkv, l.o_proj, l.gate_up, l.down)]
        floating = [w for w in packed if isinstance(w, torch.Tensor)]  # (packed quantized weights are not tensors)
        assert floating == [], f"{len(floating)} of {len(packed)} projections stayed floating point"
    finally:
        llm.close()
