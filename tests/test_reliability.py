"""Reliability on the embedded default model (SmolLM2-135M-Instruct): client disconnects free
the engine at once, overload and a full waiting queue get 429s while the admitted requests get
their unloaded answers, the limits (body size, context, default timeout) answer with JSON
naming what was exceeded, out of memory in a step fails only that step, and /health and the
launcher tell the truth about a stuck engine or a dead backend."""

import http.client
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import psutil
import pytest
import requests
from testlib import start_server, stop_server

OOM, MEMORY, HANG = 49000, 49001, 49002  # token ids the test-only fault hook reacts to


def _wait_idle(base, limit_s=10.0):
    """Seconds until the engine runs nothing and every KV block is free; the last status."""
    start = time.time()
    while True:
        w = requests.get(base + "/worker_status", timeout=10).json()
        if w["running_query_len"] + w["waiting_query_len"] == 0 and w["available_kv_cache"] == w["total_kv_cache"]:
            return time.time() - start, w
        if time.time() - start > limit_s:
            return None, w
        time.sleep(0.02)


def _native(base, prompt, timeout=120, **config):
    r = requests.post(base + "/", json={"prompt": prompt, "generate_config": config}, timeout=timeout)
    return r.status_code, r.json(), r.headers


@pytest.fixture(scope="module")
def limits_server(smollm2):
    proc, base = start_server(smollm2, "--concurrency_limit=64", "--max_batch_size=64", "--max_queue_size=40",
                              "--max_seq_len=256", "--max_body_size=65536", frontends=1)
    yield base
    assert stop_server(proc) == 0


@pytest.fixture(scope="module")
def fault_server(smollm2):
    env = dict(os.environ, RTP_LLM_TEST_FAIL_ON_TOKEN=f"{OOM}:oom,{MEMORY}:memory,{HANG}:hang")
    proc, base = start_server(smollm2, "--concurrency_limit=4", "--default_timeout_ms=1500",
                              "--engine_stall_timeout_s=2", "--max_seq_len=512", frontends=1, env=env)
    yield proc, base
    if proc.poll() is None:
        proc.kill()


def _stream_until_first_token(base, i):
    """Opens a streaming request, reads until text arrives, and returns the open connection."""
    u = urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    if i % 2:
        path, body = "/", {"prompt": f"Story {i}: once upon a time", "yield_generator": True,
                           "generate_config": {"max_new_tokens": 200, "ignore_eos": True}}
    else:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": f"Tell story {i}."}],
                                              "max_tokens": 200, "ignore_eos": True, "stream": True}
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    seen = 0
    while seen < 3:  # the chat stream's first event is the role; wait for generated text
        line = resp.readline()
        assert line, "the stream ended early"
        seen += line.startswith(b"data")
    return conn


def test_50_streaming_clients_drop_and_the_engine_frees_everything_within_1s(limits_server):
    with ThreadPoolExecutor(25) as pool:  # two waves: 50 at once would overflow --max_queue_size=40
        conns = list(pool.map(lambda i: _stream_until_first_token(limits_server, i), range(25)))
        conns += list(pool.map(lambda i: _stream_until_first_token(limits_server, i), range(25, 50)))
    w = requests.get(limits_server + "/worker_status", timeout=10).json()
    assert w["running_query_len"] == 50, w  # all of them are generating
    for c in conns:
        c.sock.shutdown(2)
        c.close()
    elapsed, w = _wait_idle(limits_server, limit_s=5)
    print(f"\ndisconnect: engine idle with every block free {elapsed:.3f} s after 50 clients dropped")
    assert elapsed is not None and elapsed < 1.0, w


def test_a_full_waiting_queue_gets_429(limits_server):
    # While 32 sequences keep the engine busy, a request for 64 more puts them all in the
    # waiting queue at once (they join the batch only between steps); the queue holds 40
    # (--max_queue_size), so that request is refused and the first one is served.
    first = {}
    t = threading.Thread(target=lambda: first.update(r=_native(
        limits_server, "Count: 1, 2, 3,", max_new_tokens=48, ignore_eos=True, num_return_sequences=32)))
    t.start()
    for _ in range(300):
        w = requests.get(limits_server + "/worker_status", timeout=10).json()
        if w["running_query_len"] == 32:
            break
        time.sleep(0.02)
    status, body, headers = _native(limits_server, "Other: a, b, c,", max_new_tokens=4, num_return_sequences=64)
    assert status == 429 and headers["Retry-After"] == "1", body
    assert body["error_code"] == 513 and "waiting queue" in body["message"], body
    t.join(timeout=120)
    status, body, _ = first["r"]
    assert status == 200 and len(body["response"]) == 32, body
    assert _wait_idle(limits_server)[0] is not None


def test_body_size_limit_is_413_with_json(limits_server):
    r = requests.post(limits_server + "/", data=json.dumps({"prompt": "x" * 70000}), timeout=30)
    assert r.status_code == 413 and "body" in r.json()["message"]
    r = requests.post(limits_server + "/v1/completions", data=json.dumps({"prompt": "x" * 70000}), timeout=30)
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"


def test_max_new_tokens_is_clamped_to_the_context_and_said_so(limits_server):
    status, body, headers = _native(limits_server, [1, 2, 3, 4, 5, 6], max_new_tokens=100000, ignore_eos=True)
    assert status == 200, body
    assert body["aux_info"]["clamped_max_new_tokens"] == 250 and body["aux_info"]["output_len"] == 250
    assert headers["X-Max-New-Tokens-Clamped"] == "250"
    r = requests.post(limits_server + "/v1/completions", json={"prompt": [1, 2, 3, 4, 5, 6], "max_tokens": 100000,
                                                               "ignore_eos": True}, timeout=120)
    assert r.status_code == 200 and r.headers["X-Max-New-Tokens-Clamped"] == "250"
    assert r.json()["choices"][0]["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 250
    status, body, headers = _native(limits_server, "hi", max_new_tokens=4)
    assert "clamped_max_new_tokens" not in body["aux_info"] and "X-Max-New-Tokens-Clamped" not in headers
    status, body, _ = _native(limits_server, list(range(1, 257)), max_new_tokens=4)
    assert status == 400 and body["error_code"] == 511 and body["message"].startswith("prompt:"), body


def test_over_the_concurrency_limit_429_and_the_admitted_answer_as_unloaded(fault_server):
    _, base = fault_server
    prompts = ["1, 2, 3, 4,", "The capital of France is", "def add(a, b):", "Monday, Tuesday,"]
    # Long enough that all 16 arrive while the first 4 are still generating.
    config = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True, "timeout_ms": 120000}
    unloaded = {p: _native(base, p, **config)[1]["response"] for p in prompts}
    with ThreadPoolExecutor(16) as pool:  # 4x --concurrency_limit=4
        results = list(pool.map(lambda i: (prompts[i % 4], _native(base, prompts[i % 4], **config)), range(16)))
    ok = [(p, body) for p, (status, body, _) in results if status == 200]
    refused = [(body, h) for _, (status, body, h) in results if status == 429]
    print(f"\noverload: {len(ok)} answered, {len(refused)} refused with 429")
    assert len(ok) == 4 and len(refused) == 12
    assert all(body["response"] == unloaded[p] for p, body in ok)
    assert all(h["Retry-After"] == "1" and body["error_code"] == 513 for body, h in refused)


def test_the_server_default_timeout_applies_when_the_request_has_none(fault_server):
    _, base = fault_server
    status, body, _ = _native(base, "Tell me a long story.", max_new_tokens=400, ignore_eos=True)
    assert status == 504 and body["error_code"] == 603, body  # --default_timeout_ms=1500
    status, body, _ = _native(base, "Tell me a story.", max_new_tokens=48, ignore_eos=True, timeout_ms=120000)
    assert status == 200 and body["aux_info"]["output_len"] == 48


@pytest.mark.parametrize("poison, kind", [(OOM, "OutOfMemoryError"), (MEMORY, "MemoryError")])
def test_out_of_memory_in_a_step_fails_its_request_and_the_engine_serves_on(fault_server, poison, kind):
    _, base = fault_server
    status, body, _ = _native(base, [1, 2, poison], max_new_tokens=4)
    assert status == 500 and body["error_code"] == 606, body
    assert "out of memory" in body["message"] and kind in body["message"], body
    status, body, _ = _native(base, "The capital of France is", max_new_tokens=8, temperature=0)
    assert status == 200 and body["aux_info"]["output_len"] > 0
    assert _wait_idle(base)[0] is not None
    assert requests.get(base + "/health", timeout=10).status_code == 200


def test_health_fails_on_a_stuck_engine_and_a_dead_backend_and_the_launcher_exits_nonzero(fault_server):
    proc, base = fault_server
    stuck = {}
    t = threading.Thread(target=lambda: stuck.update(r=_native(base, [1, 2, HANG], timeout=60, max_new_tokens=4)))
    t.start()
    for _ in range(100):  # --engine_stall_timeout_s=2
        r = requests.get(base + "/health", timeout=10)
        if r.status_code == 503:
            break
        time.sleep(0.2)
    assert r.status_code == 503 and "no step" in r.json()["message"], r.text

    # The launcher is paused so that the frontend outlives the backend for a moment.
    launcher = psutil.Process(proc.pid)
    backend = [c for c in launcher.children() if "rtp_llm.start_backend_server" in c.cmdline()]
    assert len(backend) == 1
    launcher.suspend()
    try:
        backend[0].kill()  # stays a zombie while the launcher is paused: poll, do not wait
        for _ in range(100):
            r = requests.get(base + "/health", timeout=10)
            if "not reachable" in r.text:
                break
            time.sleep(0.1)
        assert r.status_code == 503 and "not reachable" in r.json()["message"], r.text
    finally:
        launcher.resume()
    assert proc.wait(timeout=60) != 0
    t.join(timeout=60)
    assert stuck["r"][0] == 503  # the request on the dead backend got an answer, not a hang
