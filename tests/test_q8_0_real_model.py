"""GGUF Q8_0 kept quantized on the CPU, on a real model: SmolLM2-135M's file written as Q8_0
(testlib.requantize_gguf). The default bf16 run computes on the Q8_0 blocks (activations
quantized per 32-block); the fp32 run widens the same weights (the HF-parity path) and is the
reference. Read teacher-forced (rtp_llm/test/fp32_agreement.py), over these 64-token
continuations: 97.7% of 256 positions, misses where fp32's two best were within 0.25 nats.
(Free-running, the first differing token was 24, 64, 54, 8 on one CPU; bf16 rounding alone,
the same weights widened, departs as early.) Asserted: fp32_agreement's real-model bounds."""

import pytest
from fp32_agreement import teacher_forced
from testlib import requantize_gguf

from rtp_llm.llm import LLM

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "List three colors: red,"]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def smollm2_q8_0(smollm2, tmp_path_factory):
    return requantize_gguf(smollm2, str(tmp_path_factory.mktemp("q8_0") / "smollm2.q8_0.gguf"))


def test_q8_0_weights_stay_quantized(smollm2_q8_0):
    from rtp_llm.device.cpu.q8_0 import Q8_0Linear

    llm = LLM(smollm2_q8_0, act_type="bf16", progress=False, max_seq_len=512, kv_cache_mem_mb=64)
    try:
        layers = llm.engine.runner.model.layers
        assert all(isinstance(w, Q8_0Linear) for l in layers for w in (l.qkv, l.o_proj, l.gate_up, l.down))
        out = llm.generate("The capital of France is", {"max_new_tokens": 8, "temperature": 0})[0]
        assert "Paris" in out.outputs[0].text, out.outputs[0].text
    finally:
        llm.close()


def test_greedy_tokens_follow_the_dequantized_fp32_path(smollm2_q8_0):
    reading = teacher_forced(smollm2_q8_0, PROMPTS, NEW_TOKENS, "Q8_0 bf16", kv_cache_mem_mb=256)
    assert reading.follows_fp32(), reading
    assert "Paris" in reading.texts[0], reading.texts
