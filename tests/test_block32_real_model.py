"""GGUF 32-weight block formats kept quantized on the CPU, on the real models as they are
published: SmolLM2-135M-Instruct Q4_1 (every projection Q4_1; the tied embedding table Q8_0, still
widened for the lookup and the tied LM head) and Qwen2.5-Coder-0.5B-Instruct Q4_K_M (q/k/o/gate/up
Q5_0, v Q5_0 or Q8_0, down Q4_K / Q6_K, the head Q8_0). The default bf16 run computes on the
packed blocks (activations quantized per 32-block); the fp32 run widens the same weights (the
HF-parity path) and is the reference.

How closely the bf16 path follows fp32 is read teacher-forced (rtp_llm/test/fp32_agreement.py:
after each prefix of the fp32 path's 64-token greedy continuation, the bf16 path's next token).
Measured, SmolLM2 Q4_1, every projection and the tied head quantized: 95.7% of 256 positions,
misses where fp32's two best were within 0.23 nats; the whole file widened to bf16: 98.4%, misses
within 0.15. (Free-running, the first differing token moved from 26, 13, 21, 13 to 5, 5, 23, 8 on
a CPU with AVX512-BF16: a near-tie decides it.) Asserted: fp32_agreement's real-model bounds,
and the facts in the bf16 path's own text. (Qwen2.5's reading, its Q5_0 projections quantized
too, is tests/test_kquant_real_model.py's.)"""

import gguf
from fp32_agreement import teacher_forced

from rtp_llm.llm import LLM

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "List three colors: red,"]
NEW_TOKENS = 64


def _llm(path, act_type, kv_mb=128):
    return LLM(path, act_type=act_type, progress=False, max_seq_len=512, kv_cache_mem_mb=kv_mb)


def _projections(layer):
    return (layer.qkv, layer.o_proj, layer.gate_up, layer.down)


def test_smollm2_q4_1_projections_stay_quantized(smollm2):
    from rtp_llm.device.cpu.q8_0 import Q8_0Linear
    from rtp_llm.model_loader.quantized import Q8_0Tensor

    reader = gguf.GGUFReader(smollm2)
    file_bytes = sum(int(t.n_bytes) for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q4_1)
    llm = _llm(smollm2, "bf16", 64)
    try:
        layers = llm.engine.runner.model.layers
        packed = [w for l in layers for w in _projections(l)]
        assert all(isinstance(w, Q8_0Linear) and w.qtype == "Q4_1" for w in packed), packed[0]
        # Every Q4_1 tensor of the file is a projection: 384 packed bytes per 16 x 32 weights,
        # the file's 320 (nibbles as stored; d, m and the sums per line: 0.375 of bf16's).
        assert sum(w.nbytes for w in packed) * 320 == 384 * file_bytes
        # The tied head: packed from the Q8_0 embedding table, which the lookup reads as stored.
        model = llm.engine.runner.model
        assert isinstance(model.lm_head, Q8_0Linear) and model.lm_head.qtype == "Q8_0"
        assert isinstance(model.embed, Q8_0Tensor)
        out = llm.generate("The capital of France is", {"max_new_tokens": 8, "temperature": 0})[0]
        assert "Paris" in out.outputs[0].text, out.outputs[0].text
    finally:
        llm.close()


def test_qwen25_q5_0_projections_stay_quantized(qwen25):
    from rtp_llm.device.cpu.kquant import KQuantLinear
    from rtp_llm.device.cpu.q8_0 import Q8_0Linear
    from rtp_llm.model_loader.quantized import Q5_0Tensor

    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(qwen25).tensors}
    llm = _llm(qwen25, "bf16")
    try:
        for i, layer in enumerate(llm.engine.runner.model.layers):
            # q/k/v stacked: Q5_0 where v is too, else as exact Q8_0 blocks (Q5_0 is d * (q - 16)).
            want_qkv = "Q5_0" if types[f"blk.{i}.attn_v.weight"] == "Q5_0" else "Q8_0"
            assert isinstance(layer.qkv, Q8_0Linear) and layer.qkv.qtype == want_qkv, (i, layer.qkv.qtype)
            assert all(isinstance(w, Q8_0Linear) and w.qtype == "Q5_0" for w in (layer.o_proj, layer.gate_up)), i
            assert isinstance(layer.down, KQuantLinear), i
        assert isinstance(llm.engine.runner.model.lm_head, Q8_0Linear)
        assert isinstance(llm.engine.runner.model.embed, Q5_0Tensor)  # nothing widened but norms and biases
        out = llm.generate(PROMPTS[:1], {"max_new_tokens": 8, "temperature": 0})[0]
        assert "Paris" in out.outputs[0].text, out.outputs[0].text
    finally:
        llm.close()


def test_smollm2_greedy_tokens_follow_the_dequantized_fp32_path(smollm2):
    reading = teacher_forced(smollm2, PROMPTS, NEW_TOKENS, "quantized bf16")
    assert reading.follows_fp32(), reading
    text = reading.texts
    assert "Paris" in text[0] and "return" in text[1] and "boiling" in text[2] and "blue" in text[3], text
