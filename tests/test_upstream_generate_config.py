"""Upstream RTP-LLM's generate_config on the native API, on the real Qwen2.5-Coder-0.5B-Instruct:
the fields that change generation do (output and input ids, cum_log_probs, do_sample,
eos_token_id, bad_words_list, no_repeat_ngram_size, max_thinking_tokens), infrastructure fields
are accepted, and what the engine cannot do is a 400 naming it."""

import json

import pytest
from testlib import post_json

PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def server(qwen25_server):
    return qwen25_server


@pytest.fixture(scope="module")
def tok(qwen25_tokenizer):
    return qwen25_tokenizer


def native(base, body):
    status, text = post_json(base + "/", body)
    return status, json.loads(text)


def generate(base, **generate_config):
    status, body = native(base, {"prompt": PROMPT, "generate_config": {
        "max_new_tokens": 12, "temperature": 0, "return_output_ids": True, **generate_config}})
    assert status == 200, body
    return body


def test_output_ids_logprob_sums_and_ignored_fields(server, tok):
    out = generate(server, return_input_ids=True, return_cum_log_probs=True, trace_id="abc", chat_id="c1",
                   num_beams=1, reuse_cache=False, timeout_ms=-1)
    assert out["input_ids"] == tok(PROMPT).input_ids
    assert tok.decode(out["output_ids"]) == out["response"]
    assert len(out["aux_info"]["cum_log_probs"]) == 1 and out["aux_info"]["cum_log_probs"][0] < 0
    sampled = generate(server, do_sample=False, temperature=1.0)  # do_sample false: greedy whatever the temperature
    assert sampled["output_ids"] == out["output_ids"]


def test_eos_and_bad_words_change_the_output(server):
    greedy = generate(server)["output_ids"]
    first = greedy.index(greedy[3])  # where that token first comes
    stopped = generate(server, eos_token_id=greedy[3])
    assert stopped["output_ids"] == greedy[:first + 1] and stopped["aux_info"]["output_len"] == first + 1
    banned = generate(server, bad_words_list=[[greedy[0]]])["output_ids"]
    assert banned[0] != greedy[0] and greedy[0] not in banned


def test_no_repeat_ngram_size(server, tok):
    prompt_ids = tok(PROMPT).input_ids
    out = generate(server, max_new_tokens=40, no_repeat_ngram_size=2)["output_ids"]
    seq = prompt_ids + out
    for i in range(len(prompt_ids) - 1, len(seq) - 1):  # each bigram that ends in the output is new
        assert (seq[i], seq[i + 1]) not in set(zip(seq[:i], seq[1:i + 1])), i


def test_a_thinking_budget_forces_the_end_tag(server, tok):
    end = tok("</think>", add_special_tokens=False).input_ids
    out = generate(server, max_thinking_tokens=3)["output_ids"]
    assert out[3:3 + len(end)] == end and end not in [out[i:i + len(end)] for i in range(3)]
    explicit = generate(server, max_thinking_tokens=2, in_think_mode=True, end_think_token_ids=[11, 12])["output_ids"]
    assert explicit[2:4] == [11, 12]


def test_what_the_engine_cannot_do_is_refused_by_name(server):
    for field, value in [("num_beams", 2), ("return_logits", True), ("adapter_name", "x"), ("bogus_field", 1)]:
        status, body = native(server, {"prompt": PROMPT, "generate_config": {field: value}})
        assert status == 400 and body["message"].startswith(f"generate_config.{field}:"), body
