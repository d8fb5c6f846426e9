"""The server end to end on the embedded default model (SmolLM2-135M-Instruct): the seed
flow on the native API, the OpenAI API through the official client (chat, completions,
streaming, stop, n > 1, usage), errors as JSON, and served greedy output equal to the
offline API's."""

import json
import os
import signal
import time
import urllib.request

import pytest
from testlib import post_json, sse_events, sse_payload, start_server, stop_server


@pytest.fixture(scope="module")
def server(smollm2):
    proc, base = start_server(smollm2)
    yield base
    assert stop_server(proc) == 0


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server + "/v1", api_key="unused")


def test_seed_flow_native(server):
    status, text = post_json(server + "/", {"prompt": "hello, what is your name", "generate_config": {"max_new_tokens": 16}})
    assert status == 200, text
    body = json.loads(text)
    assert body["response"] and body["finished"] is True
    assert body["aux_info"]["output_len"] > 0


def test_native_streaming_ends_with_done(server):
    req = urllib.request.Request(server + "/", data=json.dumps({
        "prompt": "The capital of France is", "generate_config": {"max_new_tokens": 8, "temperature": 0},
        "yield_generator": True}).encode())
    with urllib.request.urlopen(req, timeout=120) as r:
        events = sse_events(r.read().decode())
    assert events[-1] == "data:[done]"
    last = json.loads(sse_payload(events[-2]))
    assert last["finished"] is True and "Paris" in last["response"]


def test_chat_and_usage(client):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is the capital of France?"}],
                                       max_tokens=24, temperature=0)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completions_stream_with_usage(client):
    chunks = list(client.completions.create(model="m", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text.startswith(" 5, 6")
    assert chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_stream(client):
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hello."}],
                                            max_tokens=16, temperature=0, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas)


def test_stop_string_is_not_in_the_output(client):
    r = client.completions.create(model="m", prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=["7"])
    assert r.choices[0].text == " 5, 6, "
    assert r.choices[0].finish_reason == "stop"


def test_n_sequences_with_seeds(client):
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=8, n=3, temperature=1.0, seed=7)
    assert len(r.choices) == 3 and sorted(c.index for c in r.choices) == [0, 1, 2]
    again = client.completions.create(model="m", prompt="Once upon a time", max_tokens=8, n=3, temperature=1.0, seed=7)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == \
        [c.text for c in sorted(again.choices, key=lambda c: c.index)]


def test_bad_input_is_a_400_naming_the_field(server, client):
    import openai

    status, text = post_json(server + "/", {"prompt": "hi", "generate_config": {"top_p": 3}})
    assert status == 400 and "top_p" in json.loads(text)["message"]
    status, text = post_json(server + "/", {"generate_config": {}})
    assert status == 400 and "prompt" in json.loads(text)["message"]
    status, _ = post_json(server + "/nope", {})
    assert status == 404
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="hi", max_tokens=0)
    assert "max_tokens" in str(e.value)
    status, text = post_json(server + "/", {"prompt": "x " * 3000, "generate_config": {"max_new_tokens": 4}})
    assert status == 400 and json.loads(text)["error_code"] == 511
    # Text the tokenizer drops entirely ("\x04" is no token of SmolLM2's): the field, not the engine.
    status, text = post_json(server + "/", {"prompt_batch": ["hi", "\u0004"]})
    assert status == 400 and json.loads(text)["message"].startswith("prompt_batch[1]:"), text
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="\u0004", max_tokens=4)
    assert e.value.body["param"] == "prompt"


def test_served_greedy_equals_offline(server, smollm2):
    from rtp_llm.llm import LLM

    prompts = ["The capital of France is", "def add(a, b):"]
    served = [json.loads(post_json(server + "/", {"prompt": p, "generate_config": {"max_new_tokens": 24,
                                                                                  "temperature": 0}})[1])["response"]
              for p in prompts]
    llm = LLM(smollm2, act_type="fp32", progress=False, max_seq_len=2048, kv_cache_mem_mb=256)
    offline = [o.outputs[0].text for o in llm.generate(prompts, {"max_new_tokens": 24, "temperature": 0})]
    llm.close()
    assert served == offline


def test_metrics_after_traffic(server):
    post_json(server + "/", {"prompt": "hi there", "generate_config": {"max_new_tokens": 4}})
    with urllib.request.urlopen(server + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for name in ("rtp_llm_http_requests_total", "rtp_llm_time_to_first_token_seconds_bucket",
                 "rtp_llm_e2e_request_latency_seconds_count", "rtp_llm_kv_cache_usage",
                 "rtp_llm_prefix_cache_hit_rate", "rtp_llm_running_streams"):
        assert name in text, name


def test_load_tool_reports_latencies_and_overhead(server, tmp_path):
    from rtp_llm.tools import bench_serve

    report_path = tmp_path / "report.json"
    bench_serve.main(["--base_url", server, "--endpoint", "native", "--num_prompts", "4", "--input_len", "16",
                      "--output_len", "4", "--concurrency", "2", "--save_json", str(report_path)])
    report = json.loads(report_path.read_text())
    assert report["completed"] == 4 and report["failed"] == 0
    assert report["server_overhead_ms"]["p50"] >= 0
    plot = tmp_path / "report.png"
    bench_serve.main(["--base_url", server, "--num_prompts", "4", "--input_len", "16", "--output_len", "4",
                      "--concurrency", "4", "--save_json", str(report_path), "--plot", str(plot)])
    report = json.loads(report_path.read_text())
    assert report["completed"] == 4 and report["tpot_ms"]["p50"] > 0
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_logprobs_of_chosen_tokens(client):
    import openai

    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say yes."}], max_tokens=6,
                                       temperature=0, logprobs=True)
    content = r.choices[0].logprobs.content
    assert content and all(c.logprob <= 0 for c in content)
    assert "".join(c.token for c in content).strip()
    c = client.completions.create(model="m", prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=1)
    assert len(c.choices[0].logprobs.token_logprobs) == 4
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       logprobs=True, top_logprobs=5)
    assert [len(c.top_logprobs) for c in r.choices[0].logprobs.content] == [5] * len(r.choices[0].logprobs.content)
    with pytest.raises(openai.BadRequestError) as e:  # OpenAI's bound
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       logprobs=True, top_logprobs=21)
    assert "top_logprobs" in str(e.value)


def test_sigterm_drains_requests_in_flight(smollm2):
    import threading

    proc, base = start_server(smollm2, frontends=1)
    result = {}

    def request():
        result["reply"] = post_json(base + "/", {"prompt": "Tell me a story.",
                                             "generate_config": {"max_new_tokens": 48, "ignore_eos": True}})

    t = threading.Thread(target=request)
    t.start()
    time.sleep(1.0)  # the request is generating
    proc.send_signal(signal.SIGTERM)
    t.join(timeout=120)
    status, text = result["reply"]
    assert status == 200, text
    assert json.loads(text)["aux_info"]["output_len"] == 48
    assert proc.wait(timeout=60) == 0


def test_qwen3_chat_template_honours_enable_thinking(model_cache):
    from transformers import AutoTokenizer

    from rtp_llm.frontend.app import Frontend
    from rtp_llm.frontend.openai_api import template_kwargs

    tok = AutoTokenizer.from_pretrained(os.path.join(model_cache, "qwen3-tokenizer"))
    fe = Frontend(tok, client=None, model_name="qwen3", concurrency_limit=1)
    messages = [{"role": "user", "content": "Hi"}]
    off = tok.decode(fe._chat_ids(messages, {"enable_thinking": False}))
    on = tok.decode(fe._chat_ids(messages, {}))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n")
    # The top-level spelling, and chat_template_kwargs winning over it.
    assert tok.decode(fe._chat_ids(messages, template_kwargs({"enable_thinking": False}))) == off
    both = {"enable_thinking": False, "chat_template_kwargs": {"enable_thinking": True}}
    assert tok.decode(fe._chat_ids(messages, template_kwargs(both))) == on


def test_api_key_guards_every_route_but_health(smollm2):
    proc, base = start_server(smollm2, "--kv_cache_mem_mb=128", "--max_seq_len=512", "--act_type=bf16",
                              "--host=127.0.0.1", frontends=1, env=dict(os.environ, API_KEY="s3cret"))
    try:
        body = {"prompt": "hi", "generate_config": {"max_new_tokens": 2}}
        status, text = post_json(base + "/", body)
        assert status == 401 and "API key" in json.loads(text)["message"]
        req = urllib.request.Request(base + "/", data=json.dumps(body).encode(),
                                     headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.loads(r.read())["finished"] is True
    finally:
        stop_server(proc)
