"""Tool calls on the real Qwen2.5-Coder-0.5B-Instruct (--tool_call_parser=hermes): tools reach
the model through its chat template, the answer comes back as OpenAI shapes it (tool_calls, or
content: this small model often answers with a bare JSON object rather than the tags, which
stays content), and a tool-result turn continues the conversation."""

import json

import pytest
import requests
from testlib import start_server, stop_server

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def server(qwen25):
    proc, base = start_server(qwen25, "--max_seq_len=2048", "--kv_cache_mem_mb=256", "--tool_call_parser=hermes",
                              frontends=1)
    yield base
    assert stop_server(proc) == 0


def chat(base, messages, **extra):
    r = requests.post(base + "/v1/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS,
                                                           "max_tokens": 48, "temperature": 0, **extra}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_tools_reach_the_model_and_the_answer_is_openai_shaped(server):
    choice = chat(server, [{"role": "user", "content": "What is the weather in Paris? Use the tool."}])
    message = choice["message"]
    if message.get("tool_calls"):
        assert choice["finish_reason"] == "tool_calls"
        call = message["tool_calls"][0]
        assert call["function"]["name"] == "get_weather" and isinstance(json.loads(call["function"]["arguments"]), dict)
    else:
        assert choice["finish_reason"] in ("stop", "length") and message["content"]
        assert "get_weather" in message["content"]  # the template offered the tool: the model names it


def test_a_tool_result_turn_continues_the_conversation(server):
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees Celsius."}]
    choice = chat(server, history)
    assert choice["message"]["content"] and not choice["message"].get("tool_calls"), choice
    stream = requests.post(server + "/v1/chat/completions", json={
        "model": "m", "messages": history, "tools": TOOLS, "max_tokens": 16, "temperature": 0, "stream": True},
        timeout=300, stream=True)
    assert stream.status_code == 200 and b"[DONE]" in stream.content


def _arguments_follow_the_schema(call, name):
    import jsonschema

    assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] == name
    jsonschema.validate(json.loads(call["function"]["arguments"]), TOOLS[0]["function"]["parameters"])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_a_forced_tool_choice_always_calls_the_tool_with_schema_valid_arguments(server, choice):
    # A prompt the model would rather answer in prose: the grammar makes it a call anyway.
    messages = [{"role": "user", "content": "Write a haiku about Paris."}]
    choice_ = chat(server, messages, tool_choice=choice, max_tokens=64)
    calls = choice_["message"]["tool_calls"]
    assert choice_["finish_reason"] == "tool_calls" and not choice_["message"]["content"], choice_
    assert len(calls) >= 1
    for call in calls:
        _arguments_follow_the_schema(call, "get_weather")
    # Streamed: the call's id and name first, then its arguments, then finish_reason tool_calls.
    r = requests.post(server + "/v1/chat/completions", json={
        "model": "m", "messages": messages, "tools": TOOLS, "tool_choice": choice, "max_tokens": 64,
        "temperature": 0, "stream": True, "parallel_tool_calls": False}, timeout=300, stream=True)
    assert r.status_code == 200
    deltas = [json.loads(line[6:])["choices"] for line in r.iter_lines() if line.startswith(b"data: {")]
    parts = [c[0]["delta"]["tool_calls"][0] for c in deltas if c and c[0]["delta"].get("tool_calls")]
    assert parts[0]["function"]["name"] == "get_weather" and parts[0]["id"].startswith("call_")
    arguments = "".join(p["function"]["arguments"] for p in parts)
    assert {p["index"] for p in parts} == {0}  # parallel_tool_calls false: one call
    _arguments_follow_the_schema({"id": parts[0]["id"], "type": "function",
                                  "function": {"name": "get_weather", "arguments": arguments}}, "get_weather")
    assert [c[0]["finish_reason"] for c in deltas if c and c[0]["finish_reason"]] == ["tool_calls"]


def test_a_named_choice_must_name_a_tool_and_excludes_response_format(server):
    named = {"type": "function", "function": {"name": "get_time"}}
    for extra, field in [({"tool_choice": named}, "tool_choice.function.name"),
                         ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format")]:
        r = requests.post(server + "/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, **extra}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
