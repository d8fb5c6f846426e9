"""The offline API on real GGUF models: it knows the capital of France, its greedy tokens equal
HF transformers' on the same (dequantized, fp32) weights, and so do its log-probs and their
alternatives."""

import pytest
from testlib import hf_greedy, hf_logprobs, hf_model

from rtp_llm.llm import LLM

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "List three colors: red,"]
NEW_TOKENS = 64


@pytest.fixture(scope="module", params=["smollm2", "qwen25"])
def model(request):
    path = request.getfixturevalue(request.param)
    llm = LLM(path, act_type="fp32", progress=False, max_seq_len=512, kv_cache_mem_mb=256,
              max_num_batched_tokens=32)  # small budget: the prompts are chunked
    yield path, llm
    llm.close()


def test_capital_of_france(model):
    _, llm = model
    out = llm.generate("The capital of France is", {"max_new_tokens": 8, "temperature": 0})[0]
    assert "Paris" in out.outputs[0].text, out.outputs[0].text


def test_greedy_tokens_equal_hf_transformers(model):
    path, llm = model
    hf = hf_model(path)  # the GGUF's weights dequantized, fp32; EOS an ordinary token, like ignore_eos
    config = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    ours = llm.generate(PROMPTS, config)
    for out in ours:
        assert out.outputs[0].token_ids == hf_greedy(hf, out.prompt_token_ids, NEW_TOKENS), out.prompt


def test_alternatives_equal_hf_log_softmax(model):
    path, llm = model
    out = llm.generate(PROMPTS[0], {"max_new_tokens": 4, "temperature": 0, "return_logprobs": True,
                                    "top_logprobs": 3})[0]
    seq = out.outputs[0]
    want = hf_logprobs(hf_model(path), out.prompt_token_ids + seq.token_ids)[len(out.prompt_token_ids) - 1:-1]
    for i, (token, lp, top) in enumerate(zip(seq.token_ids, seq.logprobs, seq.top_logprobs)):
        best = want[i].topk(3)
        assert [t for t, _ in top] == best.indices.tolist() and top[0][0] == token
        assert max(abs(a - float(b)) for (_, a), b in zip(top, best.values)) < 2e-3
        assert abs(lp - float(want[i, token])) < 2e-3


@pytest.mark.parametrize("name", ["smollm2", "qwen25"])
def test_capital_of_france_in_bf16(name, request):
    # bf16 runs of these GGUF files compute on their quantized blocks (every projection and the
    # LM head: the compute ops' 32-block and k-quant kernels, issue 24): prefill steps of > 16
    # rows (the long prompt) and decode batches of 2.
    llm = LLM(request.getfixturevalue(name), act_type="bf16", progress=False, max_seq_len=512, kv_cache_mem_mb=256,
              max_num_batched_tokens=64)
    prompts = ["The capital of France is",
               "Paris, London, Berlin and Rome are famous European capitals. Each one of them is the seat of its "
               "country's government. The capital of France is"]
    try:
        outs = llm.generate(prompts, {"max_new_tokens": 8, "temperature": 0})
        assert all("Paris" in o.outputs[0].text for o in outs), [o.outputs[0].text for o in outs]
        assert len(outs[1].prompt_token_ids) > 16
    finally:
        llm.close()
