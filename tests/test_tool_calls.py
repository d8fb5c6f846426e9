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
