"""Log-probs and logit_bias on the real Qwen2.5-Coder-0.5B-Instruct (fp32): the chosen tokens'
log-probs and their top alternatives equal HF transformers' fp32 log-softmax within 2e-3, on
/v1/completions and /v1/chat/completions, streamed and not; logit_bias forces (+100) or bans
(-100) a token; echo puts the prompt before the completion, and with logprobs the prompt tokens'
log-probs (HF's too), also for a prompt run in chunks and on the native API (prompt_logprobs)."""

import json

import pytest
import requests
from testlib import hf_logprobs, hf_model, sse_events, sse_payload, start_server, stop_server

TOL = 2e-3
PROMPT = "def fibonacci(n):\n"
N = 6


@pytest.fixture(scope="module")
def server(qwen25_server):
    return qwen25_server


@pytest.fixture(scope="module")
def hf(qwen25, qwen25_tokenizer):
    return qwen25_tokenizer, hf_model(qwen25)


@pytest.fixture(scope="module")
def reference(hf):
    """(tokenizer, prompt ids, HF's greedy continuation, HF's log-softmax after each prefix)."""
    tok, model = hf
    prompt = tok(PROMPT).input_ids
    ids = list(prompt)
    for _ in range(N):
        ids.append(int(hf_logprobs(model, ids)[-1].argmax()))
    lp = hf_logprobs(model, ids)[len(prompt) - 1:len(ids) - 1]  # [N, V]: the distribution of each new token
    return tok, prompt, ids[len(prompt):], lp


def post(base, path, body):
    r = requests.post(base + path, json={"model": "m", "temperature": 0, **body}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def expected_top(reference, k):
    """Per new token: HF's k best as [(text, log-prob)]."""
    tok, _, _, lp = reference
    top = lp.topk(k, dim=-1)
    return [[(tok.decode([i]), float(v)) for i, v in zip(ids.tolist(), vals)] for ids, vals in zip(top.indices,
                                                                                                  top.values)]


def assert_close_alternatives(got, want):
    """got, want: per token [(text, log-prob)] best first."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert [t for t, _ in g] == [t for t, _ in w]
        assert max(abs(a - b) for (_, a), (_, b) in zip(g, w)) < TOL, (g, w)


def test_completion_alternatives_match_hf(server, reference):
    tok, prompt, new_ids, lp = reference
    choice = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": N, "logprobs": 5})
    got = choice["logprobs"]
    assert got["tokens"] == [tok.decode([t]) for t in new_ids]  # greedy parity
    chosen = [float(lp[i, t]) for i, t in enumerate(new_ids)]
    assert max(abs(a - b) for a, b in zip(got["token_logprobs"], chosen)) < TOL
    want = expected_top(reference, 5)
    assert_close_alternatives([sorted(d.items(), key=lambda kv: -kv[1]) for d in got["top_logprobs"]], want)


def test_chat_alternatives_match_hf_streamed_and_not(server, hf):
    tok, model = hf
    messages = [{"role": "user", "content": "Name a prime number."}]
    body = {"messages": messages, "max_tokens": 5, "logprobs": True, "top_logprobs": 3}
    content = post(server, "/v1/chat/completions", body)["logprobs"]["content"]
    prompt = tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False).input_ids  # as the server renders and tokenizes it
    # HF's distributions along our (greedy) answer, token by token.
    ids, want = list(prompt), []
    for entry in content:
        lp = hf_logprobs(model, ids)[-1]
        top = lp.topk(3)
        want.append([(tok.decode([i]), float(v)) for i, v in zip(top.indices.tolist(), top.values)])
        ids.append(int(top.indices[0]))
        assert entry["token"] == want[-1][0][0] and abs(entry["logprob"] - want[-1][0][1]) < TOL
    assert_close_alternatives([[(a["token"], a["logprob"]) for a in c["top_logprobs"]] for c in content], want)
    r = requests.post(server + "/v1/chat/completions", json={"model": "m", "temperature": 0, "stream": True, **body},
                      timeout=300)
    streamed = []
    for event in sse_events(r.text):
        payload = sse_payload(event)
        if payload.startswith("{"):
            for ch in json.loads(payload)["choices"]:
                streamed += (ch.get("logprobs") or {}).get("content") or []
    assert [c["token"] for c in streamed] == [c["token"] for c in content]
    for s, c in zip(streamed, content):
        assert abs(s["logprob"] - c["logprob"]) < 1e-5
        assert [a["token"] for a in s["top_logprobs"]] == [a["token"] for a in c["top_logprobs"]]


def test_logit_bias_forces_and_bans_a_token(server, reference):
    tok, prompt, new_ids, _ = reference
    banana = tok(" banana", add_special_tokens=False).input_ids[0]
    forced = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 3, "logprobs": 0,
                                              "logit_bias": {str(banana): 100}})
    assert forced["logprobs"]["tokens"] == [tok.decode([banana])] * 3
    banned = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "logprobs": 0,
                                              "logit_bias": {str(new_ids[0]): -100}})
    assert banned["logprobs"]["tokens"][0] != tok.decode([new_ids[0]])
    r = requests.post(server + "/v1/completions", json={"model": "m", "prompt": "x", "logit_bias": {"99999999": 1}},
                      timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


def test_echo_puts_the_prompt_first(server):
    plain = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4})["text"]
    echoed = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "echo": True})["text"]
    assert echoed == PROMPT + plain


# A prompt of some 60 tokens: over the chunked server's 16-token step budget several times.
LONG_PROMPT = ("import math\n\n\ndef is_prime(n: int) -> bool:\n    if n < 2:\n        return False\n"
               "    for d in range(2, int(math.sqrt(n)) + 1):\n        if n % d == 0:\n            return False\n"
               "    return True\n")


def hf_prompt_logprobs(hf, prompt_ids, k):
    """HF's (log-prob of each prompt token after the ones before it, the first's None; its k best
    [(text, log-prob)], the first's None)."""
    tok, model = hf
    lp = hf_logprobs(model, prompt_ids)
    chosen = [None] + [float(lp[q - 1, prompt_ids[q]]) for q in range(1, len(prompt_ids))]
    top = lp[:-1].topk(k, dim=-1)
    alts = [None] + [[(tok.decode([i]), float(v)) for i, v in zip(ids.tolist(), vals)]
                     for ids, vals in zip(top.indices, top.values)]
    return chosen, alts


def assert_prompt_logprobs_match_hf(got, hf, prompt_ids, k):
    """got: a completion choice's logprobs object with echo; its first len(prompt_ids) entries."""
    tok, _ = hf
    n = len(prompt_ids)
    chosen, alts = hf_prompt_logprobs(hf, prompt_ids, k)
    assert got["tokens"][:n] == [tok.decode([t]) for t in prompt_ids]
    assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None  # nothing precedes it
    assert max(abs(a - b) for a, b in zip(got["token_logprobs"][1:n], chosen[1:])) < TOL
    assert_close_alternatives([sorted(d.items(), key=lambda kv: -kv[1]) for d in got["top_logprobs"][1:n]], alts[1:])


def test_echo_with_logprobs_starts_with_the_prompts_matching_hf(server, hf, reference):
    tok, prompt, new_ids, lp = reference
    body = {"prompt": PROMPT, "max_tokens": 3, "echo": True, "logprobs": 3}
    choice = post(server, "/v1/completions", body)
    got = choice["logprobs"]
    assert choice["text"].startswith(PROMPT)
    assert len(got["tokens"]) == len(prompt) + 3
    assert_prompt_logprobs_match_hf(got, hf, prompt, 3)
    # Then the generated tokens, as without echo.
    assert got["tokens"][len(prompt):] == [tok.decode([t]) for t in new_ids[:3]]
    chosen = [float(lp[i, t]) for i, t in enumerate(new_ids[:3])]
    assert max(abs(a - b) for a, b in zip(got["token_logprobs"][len(prompt):], chosen)) < TOL
    assert got["text_offset"][0] == 0 and got["text_offset"][len(prompt)] == len(PROMPT)
    assert got["text_offset"] == sorted(got["text_offset"])

    r = requests.post(server + "/v1/completions", json={"model": "m", "temperature": 0, "stream": True, **body},
                      timeout=300)
    assert r.status_code == 200, r.text
    text, streamed = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for event in sse_events(r.text):
        payload = sse_payload(event)
        if payload.startswith("{"):
            for ch in json.loads(payload)["choices"]:
                text += ch["text"]
                for key, values in (ch.get("logprobs") or {}).items():
                    streamed[key] += values
    assert text == choice["text"]
    assert streamed["tokens"] == got["tokens"] and streamed["text_offset"] == got["text_offset"]
    assert streamed["token_logprobs"][0] is None and streamed["top_logprobs"][0] is None
    assert max(abs(a - b) for a, b in zip(streamed["token_logprobs"][1:], got["token_logprobs"][1:])) < 1e-5
    assert [list(d) for d in streamed["top_logprobs"][1:]] == [list(d) for d in got["top_logprobs"][1:]]


def test_echo_with_logprobs_zero_gives_the_prompt_tokens_log_probs_only(server, hf, reference):
    _, prompt, _, _ = reference
    got = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 0})["logprobs"]
    chosen, _ = hf_prompt_logprobs(hf, prompt, 1)
    assert got["token_logprobs"][0] is None and got["top_logprobs"] is None
    assert max(abs(a - b) for a, b in zip(got["token_logprobs"][1:len(prompt)], chosen[1:])) < TOL


def test_native_prompt_logprobs_match_hf(server, hf, reference):
    tok, prompt, _, _ = reference
    r = requests.post(server + "/", json={"prompt": PROMPT, "generate_config": {
        "max_new_tokens": 1, "temperature": 0, "prompt_logprobs": 2}}, timeout=300)
    assert r.status_code == 200, r.text
    aux = r.json()["aux_info"]
    chosen, alts = hf_prompt_logprobs(hf, prompt, 2)
    assert aux["prompt_logprobs"][0] is None and len(aux["prompt_logprobs"]) == len(prompt)
    assert max(abs(a - b) for a, b in zip(aux["prompt_logprobs"][1:], chosen[1:])) < TOL
    assert_close_alternatives([[(tok.decode([t]), v) for t, v in row] for row in aux["prompt_top_logprobs"][1:]],
                              alts[1:])


@pytest.fixture(scope="module")
def chunked_server(qwen25):
    """A server whose steps take at most 16 tokens: a longer prompt runs in chunks."""
    proc, base = start_server(qwen25, "--max_num_batched_tokens=16", frontends=1)
    yield base
    assert stop_server(proc) == 0


def test_a_prompt_run_in_chunks_gets_every_prompt_log_prob(chunked_server, hf):
    tok, _ = hf
    prompt = tok(LONG_PROMPT).input_ids
    assert len(prompt) > 3 * 16
    for _ in range(2):  # the second time its blocks are cached: still every position runs
        got = post(chunked_server, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "echo": True,
                                                       "logprobs": 2})["logprobs"]
        assert len(got["tokens"]) == len(prompt) + 1
        assert_prompt_logprobs_match_hf(got, hf, prompt, 2)
