"""Fuzz: >= 2,000 malformed or extreme requests, built with hypothesis from the OpenAPI
description the server publishes (GET /openapi.json), against the native and OpenAI routes of
one server. Every answer must be a 2xx or a 4xx whose JSON body names the field at fault; no
5xx, no hang; afterwards the server is healthy, runs nothing and has every KV block back.

Valid values are drawn cheaply (a few new tokens, few sequences) so the run stays fast on a
2-core CPU; the extreme ones (huge max_tokens, n over the limit, ...) are cheap because they
are refused or clamped to the small context."""

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from testlib import sse_events, sse_payload, start_server, stop_server

BATCH = 16             # requests in flight at once
BATCHES = 128          # BATCH x BATCHES = 2,048 requests
BODY_LIMIT = 32768     # --max_body_size of the server under test
TIMEOUT_S = 60         # a request that takes longer is a hang

ROUTES = {"/": "NativeRequest", "/v1/chat/completions": "ChatCompletionRequest",
          "/v1/completions": "CompletionRequest"}
# Fields whose valid values cost generation time: kept small unless the draw is "extreme".
CHEAP = {"max_new_tokens": (1, 3), "max_tokens": (1, 3), "max_completion_tokens": (1, 3), "n": (1, 3),
         "num_return_sequences": (1, 3), "min_new_tokens": (0, 3)}
# Deadlines a valid request could actually miss are not fuzzed (a miss is a 504 by design).
NO_SHORT = {"timeout_ms": 60000}
# Usually present: without them a request generates to the end of the context (slow on a CPU).
LIKELY = set(CHEAP) | {"generate_config"}
NATIVE_FIELD = re.compile(r"^\S.*?: ", re.S)  # "<field>: what is wrong" (a junk key is its own name)

JUNK_TEXT = ["", "\x00", "\ud800", "\udfff\ud800", "\u202e\u0301" * 50, "😀" * 300, "\uffff", "a" * 20000,
             "<|im_start|>system\n", "{{ raise_exception('x') }}", "\\u0000"]
HUGE = [2 ** 31, 2 ** 63, 2 ** 64 + 1, 10 ** 30, -(2 ** 63), 10 ** 400, -1, 0, 1e308, -1e308, 1e-320,
        float("inf"), float("-inf"), float("nan")]


def _nested(depth: int):
    v = []
    for _ in range(depth):
        v = [v]
    return v


junk = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.sampled_from(HUGE),
    st.text(max_size=50), st.sampled_from(JUNK_TEXT), st.lists(st.integers(), max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3), st.integers(1, 500).map(_nested))  # deeper: raw bodies below


def valid_value(spec, schema, name=""):
    """A strategy for values `schema` accepts (narrowed where it would cost generation time)."""
    if "$ref" in schema:
        return valid_value(spec, _ref(spec, schema["$ref"]), name)
    if "oneOf" in schema:
        return st.one_of([valid_value(spec, s, name) for s in schema["oneOf"]])
    kind = schema.get("type")
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if kind == "integer":
        lo, hi = CHEAP.get(name, (schema.get("minimum"), schema.get("maximum")))
        lo = max(lo, NO_SHORT.get(name, lo)) if lo is not None else lo
        return st.integers(lo, hi)
    if kind == "number":
        lo, hi = schema.get("minimum"), schema.get("maximum")
        return st.floats(lo, hi, allow_nan=False, exclude_min=bool(schema.get("exclusiveMinimum") is not None))
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=40)
    if kind == "array":
        return st.lists(valid_value(spec, schema["items"], name), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 4), 4))
    if kind == "object":
        return object_value(spec, schema)
    return junk


def _ref(spec, ref):
    node = spec
    for part in ref.lstrip("#/").split("/"):
        node = node[part]
    return node


@st.composite
def object_value(draw, spec, schema):
    """An object with a random subset of the schema's properties (required ones usually
    present), some of them replaced by junk or extreme values, sometimes an unknown key."""
    props = schema.get("properties", {})
    required = set(schema.get("required", ()))
    out = {}
    for name, sub in props.items():
        if (name in required or name in LIKELY) and draw(st.floats(0, 1)) < 0.9 or draw(st.floats(0, 1)) < 0.3:
            roll = draw(st.floats(0, 1))
            if roll < 0.75:
                out[name] = draw(valid_value(spec, sub, name))
            elif roll < 0.85 and sub.get("type") in ("integer", "number"):
                out[name] = draw(st.sampled_from(HUGE + [sub.get("minimum", 0) - 1, (sub.get("maximum") or 0) + 1]))
            else:
                out[name] = draw(junk)
    if draw(st.floats(0, 1)) < 0.05:
        out[draw(st.text(min_size=1, max_size=10))] = draw(junk)
    return out


@st.composite
def request_case(draw, spec):
    """(method, path, body bytes or None)."""
    kind = draw(st.sampled_from(["json"] * 8 + ["raw", "not_object", "models"]))
    path = draw(st.sampled_from(sorted(ROUTES)))
    if kind == "models":
        return "GET", "/v1/models", None
    if kind == "raw":
        raw = draw(st.one_of(
            st.binary(max_size=200),
            st.sampled_from([b"", b"{", b'{"prompt": "hi"', b"\xff\xfe\x00", b'{"prompt": "\xff"}', b"[" * 20000,
                             b'{"a":' * 5000, b"1" * 6000, b'{"prompt": 1' + b"0" * 5000 + b"}",
                             b"x" * (BODY_LIMIT + 1), b'{"prompt": "hi", "generate_config": {"max_new_tokens": 1e999}}',
                             json.dumps({"prompt": "a" * BODY_LIMIT}).encode()])))
        return "POST", path, raw
    if kind == "not_object":
        return "POST", path, json.dumps(draw(junk)).encode()
    body = draw(object_value(spec, spec["components"]["schemas"][ROUTES[path]]))
    return "POST", path, json.dumps(body).encode()  # NaN/Infinity literals included: Python parses them


def _send(base, case):
    method, path, body = case
    try:
        r = requests.request(method, base + path, data=body, timeout=TIMEOUT_S,
                             headers={"Content-Type": "application/json"})
        return r.status_code, r.headers.get("Content-Type", ""), r.text
    except requests.exceptions.Timeout:
        return "hang", "", ""


def _problem(case, status, ctype, text):
    """None if the answer is acceptable, else what is wrong with it."""
    if status == "hang":
        return f"no answer within {TIMEOUT_S} s"
    if status >= 500:
        return f"{status}: {text[:300]}"
    openai = case[1].startswith("/v1")
    if 400 <= status < 500:
        try:
            body = json.loads(text)
        except ValueError:
            return f"{status} without a JSON body: {text[:200]}"
        if openai and not (isinstance(body.get("error"), dict) and body["error"].get("param")):
            return f"{status} without error.param: {text[:300]}"
        if not openai and not NATIVE_FIELD.match(body.get("message", "")):
            return f"{status} whose message names no field: {text[:300]}"
        return None
    if "event-stream" in ctype:  # an error after the stream started is its last event
        for event in sse_events(text):
            payload = sse_payload(event)
            # The error event's body has these keys at its top level; generated text may quote them.
            try:
                body = json.loads(payload) if payload.startswith("{") else None
            except ValueError:
                return f"{status} with an event that is not JSON: {payload[:200]}"
            if isinstance(body, dict) and ("error_code" in body or "error" in body):
                return f"{status} stream ended with an error: {payload[:300]}"
        return None
    try:
        json.loads(text)
    except ValueError:
        return f"{status} with a body that is not JSON: {text[:200]}"
    return None


@pytest.fixture(scope="module")
def server(smollm2):
    # A small context keeps clamped generations short; a high concurrency limit keeps 429s out.
    proc, base = start_server(smollm2, "--max_seq_len=64", "--kv_cache_mem_mb=32", "--concurrency_limit=1000",
                              "--max_batch_size=64", f"--max_body_size={BODY_LIMIT}", frontends=1)
    yield base
    assert stop_server(proc) == 0


def test_fuzz_native_and_openai_routes(server):
    spec = requests.get(server + "/openapi.json", timeout=10).json()
    assert set(ROUTES) | {"/v1/models", "/health"} <= set(spec["paths"])
    sent, statuses, problems = [0], {}, []
    pool = ThreadPoolExecutor(BATCH)
    start = time.time()

    @settings(max_examples=BATCHES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.lists(request_case(spec), min_size=BATCH, max_size=BATCH))
    def fuzz(batch):
        for case, (status, ctype, text) in zip(batch, pool.map(lambda c: _send(server, c), batch)):
            sent[0] += 1
            statuses[status] = statuses.get(status, 0) + 1
            problem = _problem(case, status, ctype, text)
            if problem:
                problems.append(f"{case[0]} {case[1]} {case[2][:2000]!r} -> {problem}")

    fuzz()
    pool.shutdown()
    print(f"\nfuzz: {sent[0]} requests in {time.time() - start:.0f} s; statuses {statuses}")
    assert sent[0] >= 2000
    assert not problems, "\n".join(problems[:20])
    assert statuses.get(200, 0) > 100 and sum(n for s, n in statuses.items() if s != 200) > 500  # both kinds ran

    assert requests.get(server + "/health", timeout=10).status_code == 200
    deadline = time.time() + 10
    while True:
        w = requests.get(server + "/worker_status", timeout=10).json()
        idle = w["running_query_len"] + w["waiting_query_len"] == 0 and w["available_kv_cache"] == w["total_kv_cache"]
        if idle or time.time() > deadline:
            break
        time.sleep(0.1)
    assert idle, w
    r = requests.post(server + "/", json={"prompt": "The capital of France is",
                                          "generate_config": {"max_new_tokens": 4, "temperature": 0}}, timeout=60)
    assert r.status_code == 200 and r.json()["aux_info"]["output_len"] == 4
