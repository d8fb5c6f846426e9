"""--quantization=int8 on a real model: Qwen2.5-Coder-0.5B's Q4_K_M file, whose Q5_0 tensors
(most of it: its hidden size 896 is not a multiple of 256) are widened at load, now quantized
to int8 blocks instead (model_loader/quantize_at_load.py), next to the file's own kept formats.
The answer stays the right one."""

from rtp_llm.llm import LLM


def test_int8_at_load_keeps_the_answer(qwen25):
    from rtp_llm.device.cpu.kquant import KQuantLinear
    from rtp_llm.device.cpu.q8_0 import Q8_0Linear

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
        floating = [w for w in packed if not isinstance(w, (Q8_0Linear, KQuantLinear))]
        assert floating == [], f"{len(floating)} of {len(packed)} projections stayed floating point"
    finally:
        llm.close()
