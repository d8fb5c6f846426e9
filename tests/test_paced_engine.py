"""The benchmark-only paced engine (--paced_engine_step_ms): no model runs, yet the whole
serving path is real. Served: a streaming /v1/completions request gets exactly its max_tokens
of real text (the paced paragraph, detokenized by the frontend), prompt log-probs (all 0) do not
fail their step, the native API answers, and /worker_status counts steps. In process: it says what it is, never emits a special token, and
holds KV blocks for max_batch_size streams of max_seq_len at once."""

import json
import logging

import pytest
import requests
from testlib import sse_events, sse_payload, start_server, stop_server


@pytest.fixture(scope="module")
def server(smollm2):
    # One frontend: its /health passing means its channel to the backend is up, so the
    # /worker_status reads below (which do not wait for a channel) go to a connected frontend.
    proc, base = start_server(smollm2, "--paced_engine_step_ms=2", frontends=1)
    yield base
    assert stop_server(proc) == 0


def test_a_streamed_completion_is_max_tokens_of_the_paced_text(server):
    from rtp_llm.async_decoder_engine.paced import PARAGRAPH

    r = requests.post(server + "/v1/completions", json={
        "model": "m", "prompt": "Tell me about the town.", "max_tokens": 50, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True}}, timeout=120)
    assert r.status_code == 200, r.text
    chunks = [json.loads(sse_payload(e)) for e in sse_events(r.text)[:-1]]
    assert sse_events(r.text)[-1] == "data: [DONE]"
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] == 50
    assert text.strip() and PARAGRAPH.startswith(text), text  # 50 tokens: within the paragraph


def test_prompt_logprobs_are_served_as_zeros_not_a_failed_step(server):
    r = requests.post(server + "/v1/completions", json={
        "model": "m", "prompt": "Tell me about the town.", "max_tokens": 4, "echo": True, "logprobs": 2,
        "ignore_eos": True}, timeout=120)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and len(lp["tokens"]) > 5
    assert all(v == 0 for v in lp["token_logprobs"][1:])  # no model: every log-prob is 0


def test_the_native_api_and_worker_status_steps(server):
    before = requests.get(server + "/worker_status", timeout=10).json()
    r = requests.post(server + "/", json={"prompt": "hello", "generate_config": {"max_new_tokens": 20}}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["finished"] and body["response"].strip() and body["aux_info"]["output_len"] == 20  # never an EOS
    after = requests.get(server + "/worker_status", timeout=10).json()
    assert after["iterate_count"] >= before["iterate_count"] + 20, (before, after)
    assert after["generated_tokens"] >= before["generated_tokens"] + 20, (before, after)


def test_in_process_it_warns_emits_no_special_token_and_fits_every_stream(smollm2, caplog):
    from rtp_llm.async_decoder_engine.engine import EngineArgs
    from rtp_llm.async_decoder_engine.paced import paced_engine, paragraph_ids
    from rtp_llm.config.generate_config import GenerateConfig
    from rtp_llm.model_loader import load_tokenizer

    with caplog.at_level(logging.WARNING):
        engine = paced_engine(smollm2, None, None, EngineArgs(max_seq_len=256, max_batch_size=4), 0.01)
    assert "BENCHMARK-ONLY" in caplog.text and "not a model's output" in caplog.text
    try:
        tokenizer = load_tokenizer(smollm2)
        ids = paragraph_ids(tokenizer)
        prompt = tokenizer.encode("Once upon a time", add_special_tokens=False)
        new = 256 - len(prompt)  # every stream fills max_seq_len, wrapping around the paragraph
        config = GenerateConfig(max_new_tokens=new, temperature=0).to_proto()
        streams = [engine.core.enqueue(prompt, config) for _ in range(4)]
        while engine.step():
            pass
        assert engine.core.stats()["preemptions"] == 0  # all four held their KV blocks at once
        expected = [int(ids[i % len(ids)]) for i in range(new)]
        for sid in streams:
            tokens, prompt_len = engine.core.stream_tokens(sid)
            assert tokens[prompt_len:].tolist() == expected
        assert not set(expected) & set(tokenizer.all_special_ids)
        assert len(ids) < new  # the cycle wrapped
    finally:
        engine.close()
