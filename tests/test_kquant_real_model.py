"""GGUF Q4_K and Q6_K kept quantized on the CPU, on a real model: Qwen2.5-Coder-0.5B-Instruct
Q4_K_M. In that file only ffn_down is Q4_K / Q6_K (12 layers each; its 896 hidden inputs are no
multiple of 256, so llama.cpp wrote q/k/v/o/gate/up as Q5_0, some v as Q8_0, the head as Q8_0):
the default bf16 run computes those on the packed blocks (activations quantized per 256), the
Q5_0 / Q8_0 ones on the 32-block kernel; the fp32 run widens everything and is the reference.

Read teacher-forced (rtp_llm/test/fp32_agreement.py), over these 64-token continuations, with
nothing but norms and biases widened: 99.6% of 256 positions, the one miss where fp32's two best
were 0.02 nats apart. (Free-running, the first differing token was 2, 64, 20, 64 for both the
kept and the widened k-quants: bf16 rounding alone departs as early.) Asserted:
fp32_agreement's real-model bounds, and the facts in the bf16 path's own text."""

import gguf
from fp32_agreement import teacher_forced

from rtp_llm.llm import LLM

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "List three colors: red,"]
NEW_TOKENS = 64


def _llm(path, act_type):
    return LLM(path, act_type=act_type, progress=False, max_seq_len=512, kv_cache_mem_mb=128)


def test_down_projections_stay_quantized(qwen25):
    from rtp_llm.device.cpu.kquant import KQuantLinear

    types = {t.name: t.tensor_type for t in gguf.GGUFReader(qwen25).tensors}
    llm = _llm(qwen25, "bf16")
    try:
        layers = llm.engine.runner.model.layers
        for i, layer in enumerate(layers):
            want = {gguf.GGMLQuantizationType.Q4_K: "q4_k", gguf.GGMLQuantizationType.Q6_K: "q6_k"}[
                types[f"blk.{i}.ffn_down.weight"]]
            assert isinstance(layer.down, KQuantLinear) and layer.down.stem == want, (i, layer.down)
            # 896 x 4864: per 16 columns x 256 inputs 2368 (Q4_K) or 3392 (Q6_K) bytes.
            assert layer.down.nbytes == 896 // 16 * 4864 // 256 * (2368 if want == "q4_k" else 3392)
        assert {l.down.stem for l in layers} == {"q4_k", "q6_k"}
        out = llm.generate(PROMPTS[:1], {"max_new_tokens": 8, "temperature": 0})[0]
        assert "Paris" in out.outputs[0].text, out.outputs[0].text
    finally:
        llm.close()


def test_greedy_tokens_follow_the_dequantized_fp32_path(qwen25):
    reading = teacher_forced(qwen25, PROMPTS, NEW_TOKENS, "k-quant bf16")
    assert reading.follows_fp32(), reading
    text = reading.texts
    assert "Paris" in text[0] and "100" in text[2] and "blue" in text[3], text
    assert "return" in text[1], text
