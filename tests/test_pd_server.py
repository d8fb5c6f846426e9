"""Prefill/decode disaggregation on the CPU with SmolLM2: a PREFILL and a DECODE instance on one
machine (the KV blocks move through NIXL over UCX's TCP / shared memory) answer exactly as one
PDFUSION instance does, streamed and not, with prefix-cache hits on the decode side; a client
that goes away mid-stream frees both sides' blocks; a decode instance killed mid-run fails its
requests with a clear error while the prefill instance keeps serving."""

import json
import signal
import time
import urllib.request

import pytest
from testlib import post_json, sse_events, sse_payload, start_server, stop_server

pytest.importorskip("nixl_cu12", reason="the KV transfer needs NIXL: pip install nixl-cu12")

# Long enough for several full 16-token blocks (what moves), and one that fits in no block.
PROMPTS = ["Write a short story about a lighthouse keeper who finds a message in a bottle. The story "
           "should mention the sea, a storm, an old map, a seagull named Pip and a lost ship.",
           "Hello"]
CONFIG = {"max_new_tokens": 24, "temperature": 0}


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def fusion(smollm2):
    proc, base = start_server(smollm2, frontends=1)
    yield base
    assert stop_server(proc) == 0


@pytest.fixture(scope="module")
def pd(smollm2):
    decode, dbase = start_server(smollm2, "--role_type=DECODE", "--kv_transfer_host=127.0.0.1", frontends=1)
    prefill, pbase = start_server(smollm2, "--role_type=PREFILL", f"--remote_rpc_server_ip=127.0.0.1:{_port(dbase) + 1}",
                                  "--kv_transfer_host=127.0.0.1", frontends=1)
    state = {"decode": decode, "prefill": prefill, "dbase": dbase, "pbase": pbase}
    yield state
    for name in ("prefill", "decode"):
        p = state[name]
        if p.poll() is None:
            assert stop_server(p) == 0


def _native(base, prompt, config=CONFIG):
    status, body = post_json(base + "/", {"prompt": prompt, "generate_config": config})
    assert status == 200, body
    return json.loads(body)


def _wait_idle(dbase, pbase, timeout=30):
    """Both sides' blocks back: no stream on the decode instance, no export on the prefill one."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        d, p = _get(dbase + "/worker_status"), _get(pbase + "/worker_status")
        if (d["running_query_len"] + d["waiting_query_len"] == 0 and d["available_kv_cache"] == d["total_kv_cache"]
                and p["kv_exports"] == 0 and p["available_kv_cache"] == p["total_kv_cache"]):
            return d, p
        time.sleep(0.2)
    raise AssertionError(f"blocks not back: decode {d}, prefill {p}")


def test_the_pair_answers_as_one_instance_and_reads_only_what_it_lacks(fusion, pd):
    dbase, pbase = pd["dbase"], pd["pbase"]
    for prompt in PROMPTS:
        want = _native(fusion, prompt)
        got = _native(pbase, prompt)
        assert got["response"] == want["response"], prompt
        for key in ("input_len", "output_len"):
            assert got["aux_info"][key] == want["aux_info"][key], key
    d, p = _wait_idle(dbase, pbase)
    assert d["kv_imports"] == 1 and d["kv_import_failures"] == 0  # "Hello" has no full block to read
    moved = d["kv_imported_blocks"]
    assert moved >= 2 and d["kv_import_bytes"] > 0  # the long prompt's full blocks
    assert p["kv_exported_blocks"] == moved
    # Again: the decode instance has those blocks cached, so nothing moves.
    assert _native(pbase, PROMPTS[0])["response"] == _native(fusion, PROMPTS[0])["response"]
    d, _ = _wait_idle(dbase, pbase)
    assert (d["kv_imports"], d["kv_imported_blocks"]) == (2, moved)
    metrics = urllib.request.urlopen(dbase + "/metrics", timeout=10).read().decode()
    assert f'rtp_llm_kv_transfer_blocks_total{{direction="recv"}} {moved}' in metrics
    assert "rtp_llm_kv_transfer_seconds_count 2" in metrics  # both reads, the empty one too
    assert f"rtp_llm_kv_transfer_bytes_sum {d['kv_import_bytes']}" in metrics


def test_streamed_completions_equal_the_single_instance(fusion, pd):
    body = {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0, "stream": True}
    texts = []
    for base in (fusion, pd["pbase"]):
        status, raw = post_json(base + "/v1/completions", body)
        assert status == 200, raw
        chunks = [json.loads(sse_payload(e)) for e in sse_events(raw) if sse_payload(e) != "[DONE]"]
        texts.append("".join(c["choices"][0]["text"] for c in chunks))
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert len(chunks) >= 10  # the first token from the prefill instance, the rest as they come
    assert texts[0] == texts[1] and texts[0]
    _wait_idle(pd["dbase"], pd["pbase"])


def test_a_first_token_that_ends_the_request_never_leaves_the_prefill_instance(fusion, pd):
    one = {"max_new_tokens": 1, "temperature": 0}
    before = _get(pd["dbase"] + "/worker_status")["kv_imports"]
    assert _native(pd["pbase"], PROMPTS[0], one)["response"] == _native(fusion, PROMPTS[0], one)["response"]
    d, _ = _wait_idle(pd["dbase"], pd["pbase"])
    assert d["kv_imports"] == before


def test_a_request_with_a_grammar_runs_whole_on_the_prefill_instance(fusion, pd):
    body = {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0, "structured_outputs": {"choice": ["yes", "no"]}}
    before = _get(pd["dbase"] + "/worker_status")["kv_imports"]
    answers = []
    for base in (fusion, pd["pbase"]):
        status, raw = post_json(base + "/v1/completions", body)
        assert status == 200, raw
        answers.append(json.loads(raw)["choices"][0]["text"])
    assert answers[0] == answers[1] and answers[0] in ("yes", "no")
    d, _ = _wait_idle(pd["dbase"], pd["pbase"])
    assert d["kv_imports"] == before  # the matcher's state stays where it samples


def test_a_client_gone_mid_stream_frees_both_sides(pd):
    body = json.dumps({"prompt": PROMPTS[0] + " Continue at length.", "max_tokens": 400, "temperature": 0,
                       "stream": True, "ignore_eos": True}).encode()
    req = urllib.request.Request(pd["pbase"] + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        for _ in range(6):  # a few events: the request runs on the decode instance now
            r.readline()
    d, p = _wait_idle(pd["dbase"], pd["pbase"])
    assert p["kv_exports"] == 0


def test_a_killed_decode_instance_fails_requests_clearly_and_the_prefill_instance_keeps_serving(pd):
    pd["decode"].send_signal(signal.SIGKILL)  # its children die with it
    pd["decode"].wait(timeout=30)
    status, body = post_json(pd["pbase"] + "/", {"prompt": PROMPTS[0], "generate_config": CONFIG}, timeout=60)
    assert status >= 500, body
    assert "DECODE instance" in json.loads(body)["message"]
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(pd["pbase"] + "/health", timeout=10)
        except urllib.error.HTTPError as e:
            assert e.code == 503
            assert "DECODE instance" in e.read().decode()
            break
        time.sleep(0.5)
    else:
        raise AssertionError("/health kept answering 200 without the decode instance")
    assert pd["prefill"].poll() is None
    assert _get(pd["pbase"] + "/worker_status")["alive"]
