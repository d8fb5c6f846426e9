"""Structured output on a random-weights Qwen3 with the real Qwen3 tokenizer (151,936 tokens):
sampled at temperature 1 under a non-trivial JSON Schema, every answer is schema-valid JSON
(checked with jsonschema) that ends with "stop"; regex and choice answers fullmatch; json_object
answers parse; greedy answers under a grammar that admits the unconstrained answer are that
answer; the same with overlapped scheduling on and off, on CPU and (where torch sees a GPU)
CUDA. Then the server: OpenAI's response_format and vLLM's structured_outputs (streamed too),
the native generate_config fields, a 400 naming the field for a grammar that does not compile,
and the grammar counters in /worker_status and /metrics.

GPU: python3 -m pytest -q tests/test_structured_output.py -m gpu (the CUDA cases)."""

import json
import os
import re

import jsonschema
import pytest
import torch
from testlib import post_json, sse_events, sse_payload, start_server, stop_server

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,7}$"},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "pattern": "^[a-z]{2,8}$"},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1,
                 "maxItems": 3},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2,
                   "maxItems": 2},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "address", "tags", "scores", "active"],
    "additionalProperties": False,
}
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@pytest.fixture(scope="module")
def qwen3_random(request, tmp_path_factory):
    """A 2-layer Qwen3 with random weights and the real tokenizer (EOS <|im_end|>). The
    tokenizer comes from the model cache; where it is there already (the GPU machine: carried
    in), the other models are not fetched."""
    import shutil

    from transformers import Qwen3Config, Qwen3ForCausalLM

    cache = os.environ.get("RTP_LLM_MODEL_CACHE", os.path.expanduser("~/.cache/rtp_llm/models"))
    tok_dir = os.path.join(cache, "qwen3-tokenizer")
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        tok_dir = os.path.join(request.getfixturevalue("model_cache"), "qwen3-tokenizer")
    out = str(tmp_path_factory.mktemp("qwen3_random"))
    cfg = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=2048,
                      tie_word_embeddings=True, eos_token_id=151645, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    for name in os.listdir(tok_dir):
        shutil.copy(os.path.join(tok_dir, name), out)
    return out


@pytest.fixture(scope="module")
def engines(qwen3_random):
    """LLM per (device, overlap), made on first use."""
    from rtp_llm.llm import LLM

    made = {}

    def get(device, overlap):
        if (device, overlap) not in made:
            made[(device, overlap)] = LLM(qwen3_random, device=device, overlap_schedule=overlap, progress=False,
                                          max_batch_size=16, max_seq_len=1024, kv_cache_mem_mb=256,
                                          act_type="fp32" if device == "cpu" else "bf16")
        return made[(device, overlap)]

    yield get
    for llm in made.values():
        llm.close()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("overlap", [False, True])
def test_sampled_answers_follow_their_grammar_and_stop(engines, device, overlap):
    llm = engines(device, overlap)
    configs = [{"max_new_tokens": 200, "temperature": 1.0, "random_seed": s, "json_schema": SCHEMA}
               for s in range(8)]
    configs += [{"max_new_tokens": 40, "temperature": 1.0, "random_seed": 1, "regex": r"[a-z]{3,6}@[a-z]{2,4}\.com"},
                {"max_new_tokens": 40, "temperature": 1.0, "random_seed": 2, "regex": "(red|green|blue)"},
                {"max_new_tokens": 200, "temperature": 1.0, "random_seed": 3, "response_format": {"type": "json_object"}},
                {"max_new_tokens": 20, "temperature": 1.0, "random_seed": 4}]  # unconstrained, in the same steps
    outs = [o.outputs[0] for o in llm.generate(["Describe a user as JSON:"] * len(configs), configs)]
    for seq in outs[:8]:
        assert seq.finish_reason == "stop", seq.text
        jsonschema.validate(json.loads(seq.text), SCHEMA)
        assert seq.token_ids[-1] == 151645
    assert re.fullmatch(r"[a-z]{3,6}@[a-z]{2,4}\.com", outs[8].text) and outs[8].finish_reason == "stop"
    assert outs[9].text in ("red", "green", "blue") and outs[9].finish_reason == "stop"
    if outs[10].finish_reason == "stop":  # a free-form object may run to max_new_tokens
        assert isinstance(json.loads(outs[10].text), (dict, list))
    else:
        assert outs[10].text.startswith(("{", "["))
    assert outs[11].finish_reason in ("stop", "length")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_under_a_grammar_admitting_the_unconstrained_answer_is_that_answer(engines, device, overlap):
    from rtp_llm.config.grammar import literal_regex

    llm = engines(device, overlap)
    prompts = [f"Item {i}: the value is" for i in range(12)]
    free = [o.outputs[0] for o in llm.generate(prompts, {"max_new_tokens": 8, "temperature": 0})]
    # Stray bytes of a UTF-8 sequence (U+FFFD in the text) match no text grammar: those stay free.
    pinned = [{"max_new_tokens": 8, "temperature": 0}
              | ({"regex": f"({literal_regex(seq.text)})|xyz"} if seq.text and "\ufffd" not in seq.text else {})
              for seq in free]
    assert sum("regex" in c for c in pinned) >= 3
    llm.generate(prompts, pinned)  # compiles them: the second run admits every stream at once, as the first did
    got = [o.outputs[0] for o in llm.generate(prompts, pinned)]
    for seq, g in zip(free, got):
        assert g.token_ids == seq.token_ids, seq.text


def test_server_apis(qwen3_random):
    proc, base = start_server(qwen3_random, "--kv_cache_mem_mb=256", "--max_seq_len=1024", "--act_type=fp32",
                              "--host=127.0.0.1", frontends=1)
    try:
        msgs = [{"role": "user", "content": "A user, as JSON"}]
        fmt = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}}
        status, text = post_json(base + "/v1/chat/completions", {"messages": msgs, "max_tokens": 200, "seed": 5,
                                                                 "response_format": fmt})
        assert status == 200, text
        choice = json.loads(text)["choices"][0]
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
        assert choice["finish_reason"] == "stop"

        status, text = post_json(base + "/v1/chat/completions", {"messages": msgs, "max_tokens": 200, "seed": 6,
                                                                 "response_format": fmt, "stream": True})
        assert status == 200, text
        chunks = [json.loads(p) for p in map(sse_payload, sse_events(text)) if p and p != "[DONE]"]
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        jsonschema.validate(json.loads(content), SCHEMA)

        status, text = post_json(base + "/v1/completions", {"prompt": "Pick:", "max_tokens": 10, "seed": 1,
                                                            "structured_outputs": {"choice": ["yes", "no"]}})
        assert status == 200 and json.loads(text)["choices"][0]["text"] in ("yes", "no"), text

        status, text = post_json(base + "/", {"prompt": "Digits:", "generate_config": {
            "max_new_tokens": 20, "regex": "[0-9]{4}"}})
        assert status == 200 and re.fullmatch("[0-9]{4}", json.loads(text)["response"]), text

        status, text = post_json(base + "/v1/chat/completions", {"messages": msgs, "max_tokens": 5,
                                                                 "structured_outputs": {"regex": "[a-"}})
        assert status == 400 and json.loads(text)["error"]["param"] == "structured_outputs", text

        with __import__("urllib.request").request.urlopen(base + "/worker_status", timeout=30) as r:
            w = json.loads(r.read())
        assert w["grammar_requests"] >= 5 and w["grammar_failures"] >= 1 and w["grammar_compiles"] >= 3
        assert w["grammar_cache_hits"] >= 1  # the chat schema, twice
        with __import__("urllib.request").request.urlopen(base + "/metrics", timeout=30) as r:
            assert "rtp_llm_grammar_compiles_total" in r.read().decode()
    finally:
        stop_server(proc)
