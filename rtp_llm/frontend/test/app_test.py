"""The frontend's routes over a scripted backend: the core's finish_reason reaches both APIs
(also "length" when a stream ends before max_new_tokens, e.g. at max_seq_len), an engine
error's field is named as the request named it, and SSE framing of both APIs."""

import asyncio
import json
import unittest

from aiohttp.test_utils import TestClient, TestServer

from rtp_llm.config.grammar import GRAMMAR_FIELDS, JSON_OBJECT_SCHEMA
from rtp_llm.frontend.app import Frontend
from rtp_llm.frontend.backend_client import BackendError, Chunk
from rtp_llm.frontend.errors import ErrorCode


class ByteTokenizer:
    """One token per UTF-8 byte (ids < 256), a trivial chat template."""

    def __len__(self):
        return 256

    def __call__(self, text, add_special_tokens=True):
        class Encoded:
            input_ids = list(text.encode())
        return Encoded()

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, tools=None, **kwargs):
        offer = "".join(f"tool: {t['function']['name']}\n" for t in tools or ())
        return offer + "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


class Worker:
    alive, running_query_len, waiting_query_len, iterate_count = True, 0, 0, 1
    available_kv_cache = total_kv_cache = 1000
    max_seq_len = 512


class ScriptedBackend:
    """Streams `text` a byte a chunk and finishes with `reason` (with prompt_logprobs k the first
    chunk carries -1.0 for each prompt token after the first, its alternatives itself then "z"
    (-3), as the core sends them); a prompt with a "!" is refused
    as the core refuses an empty prompt (field token_ids), one with a "?" as a bad
    max_new_tokens, one with a "#" and a grammar as a grammar that does not compile."""

    def __init__(self, text="abc", reason="length"):
        self.text, self.reason = text, reason
        self.configs = []  # the GenerateConfigPB of each call
        self.prompts = []  # and its prompt

    async def health(self, timeout=2.0, wait_for_ready=False):
        return True

    async def worker_status(self, timeout=5.0, wait_for_ready=False):
        return Worker

    async def generate(self, token_ids, config, request_id=0):
        self.configs.append(config)
        self.prompts.append(list(token_ids))
        if ord("!") in token_ids:
            raise BackendError(400, ErrorCode.INVALID_PARAMS, "token_ids must not be empty", "token_ids")
        if ord("?") in token_ids:
            raise BackendError(400, ErrorCode.INVALID_PARAMS, "max_new_tokens must be >= 1", "max_new_tokens")
        kind = next((k for k in GRAMMAR_FIELDS if config.HasField(k)), None)
        if ord("#") in token_ids and kind:
            raise BackendError(400, ErrorCode.INVALID_PARAMS, f"{kind} does not compile", kind)
        data = self.text.encode()
        k = config.prompt_logprobs.value if config.HasField("prompt_logprobs") else None
        for i, b in enumerate(data):
            last = i == len(data) - 1
            # Log-probs when asked: -0.5 for each token, its alternatives itself then "z" (-2).
            lp = [-0.5] if config.return_softmax_probs else None
            top = [[(b, -0.5), (ord("z"), -2.0)][:config.top_logprobs]] if config.top_logprobs else None
            prompt = [-1.0] * (len(token_ids) - 1) if k is not None and i == 0 else None
            prompt_top = [[(t, -1.0), (ord("z"), -3.0)][:k] for t in token_ids[1:]] if prompt and k else None
            yield Chunk([b], last, {"output_len": i + 1}, lp, self.reason if last else None, top, prompt, prompt_top)
            await asyncio.sleep(0)


class AppTest(unittest.IsolatedAsyncioTestCase):
    async def request(self, path, body, backend=None, **frontend_args):
        fe = Frontend(ByteTokenizer(), backend or ScriptedBackend(), "m", concurrency_limit=4, **frontend_args)
        async with TestClient(TestServer(fe.app())) as client:
            r = await client.post(path, data=json.dumps(body))
            return r.status, r.headers, await r.text()

    async def test_the_core_finish_reason_reaches_openai(self):
        # The stream ends after 3 tokens of max_tokens 100: only the core knows it was length.
        status, _, text = await self.request("/v1/completions", {"prompt": "hi", "max_tokens": 100})
        self.assertEqual(status, 200, text)
        self.assertEqual(json.loads(text)["choices"][0]["finish_reason"], "length")
        status, _, text = await self.request("/v1/completions", {"prompt": "hi", "max_tokens": 100},
                                             ScriptedBackend(reason="stop"))
        self.assertEqual(json.loads(text)["choices"][0]["finish_reason"], "stop")

    async def test_a_stop_string_is_stop_whatever_the_core_says(self):
        status, _, text = await self.request("/v1/completions", {"prompt": "hi", "max_tokens": 100, "stop": "b"})
        choice = json.loads(text)["choices"][0]
        self.assertEqual((choice["text"], choice["finish_reason"]), ("a", "stop"))

    async def test_streamed_chat_framing_and_finish_reason(self):
        status, headers, text = await self.request("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "stream": True})
        self.assertEqual((status, headers["Content-Type"]), (200, "text/event-stream"))
        events = text.split("\n\n")
        self.assertEqual(events[-2:], ["data: [DONE]", ""])
        chunks = [json.loads(e[len("data: "):]) for e in events[:-2]]
        self.assertEqual(chunks[0]["choices"][0]["delta"], {"role": "assistant", "content": ""})
        self.assertEqual("".join(c["choices"][0]["delta"].get("content", "") for c in chunks), "abc")
        self.assertEqual([c["choices"][0]["finish_reason"] for c in chunks][-1], "length")

    async def test_native_stream_framing(self):
        status, _, text = await self.request("/", {"prompt": "hi", "generate_config": {"yield_generator": True}})
        events = text.split("\n\n")
        self.assertEqual(events[-2:], ["data:[done]", ""])
        self.assertEqual([json.loads(e[len("data:"):])["response"] for e in events[:-2]], ["a", "ab", "abc"])

    async def test_a_reasoning_parser_splits_the_thinking_from_the_content(self):
        think = ScriptedBackend(text="<think>2+2 is 4</think>\n\nFour.", reason="stop")
        chat = {"messages": [{"role": "user", "content": "2+2"}], "max_tokens": 50}
        status, _, text = await self.request("/v1/chat/completions", chat, think, reasoning_parser="qwen3")
        self.assertEqual(status, 200, text)
        message = json.loads(text)["choices"][0]["message"]
        self.assertEqual((message["reasoning_content"], message["content"]), ("2+2 is 4", "\n\nFour."))
        _, _, text = await self.request("/v1/chat/completions", dict(chat, stream=True), think,
                                        reasoning_parser="qwen3")
        deltas = [json.loads(e[len("data: "):])["choices"][0]["delta"] for e in text.split("\n\n")[:-2]]
        self.assertEqual("".join(d.get("reasoning_content", "") for d in deltas), "2+2 is 4")
        self.assertEqual("".join(d.get("content", "") for d in deltas), "\n\nFour.")
        self.assertFalse(any("think>" in d.get("content", "") + d.get("reasoning_content", "") for d in deltas))
        # Without a parser the thinking stays in the content, and there is no reasoning_content.
        _, _, text = await self.request("/v1/chat/completions", chat, think)
        message = json.loads(text)["choices"][0]["message"]
        self.assertEqual(message["content"], "<think>2+2 is 4</think>\n\nFour.")
        self.assertNotIn("reasoning_content", message)

    async def test_tool_calls_come_back_whole_and_streamed(self):
        call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        backend = ScriptedBackend(text="Checking. " + call, reason="stop")
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        chat = {"messages": [{"role": "user", "content": "weather in Paris"}], "max_tokens": 200, "tools": tools}
        status, _, text = await self.request("/v1/chat/completions", chat, backend, tool_call_parser="hermes")
        self.assertEqual(status, 200, text)
        choice = json.loads(text)["choices"][0]
        self.assertEqual(choice["finish_reason"], "tool_calls")
        self.assertEqual(choice["message"]["content"], "Checking. ")
        [got] = choice["message"]["tool_calls"]
        self.assertEqual((got["type"], got["function"]["name"]), ("function", "get_weather"))
        self.assertEqual(json.loads(got["function"]["arguments"]), {"city": "Paris"})
        self.assertIn(b"tool: get_weather", bytes(backend.prompts[-1]))  # the template offered the tool

        _, _, text = await self.request("/v1/chat/completions", dict(chat, stream=True), backend,
                                        tool_call_parser="hermes")
        chunks = [json.loads(e[len("data: "):])["choices"] for e in text.split("\n\n")[:-2]]
        deltas = [c[0]["delta"] for c in chunks if c]
        calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
        self.assertEqual((calls[0]["id"][:5], calls[0]["function"]["name"]), ("call_", "get_weather"))
        self.assertEqual(json.loads("".join(c["function"]["arguments"] for c in calls)), {"city": "Paris"})
        self.assertEqual("".join(d.get("content", "") for d in deltas), "Checking. ")
        self.assertEqual(chunks[-1][0]["finish_reason"], "tool_calls")

        # A server without --tool_call_parser refuses tools rather than dropping them.
        status, _, text = await self.request("/v1/chat/completions", chat, backend)
        self.assertEqual((status, json.loads(text)["error"]["param"]), (400, "tools"))

    async def test_a_chat_without_a_limit_may_use_the_rest_of_the_context(self):
        backend = ScriptedBackend()
        messages = [{"role": "user", "content": "hi"}]
        status, headers, text = await self.request("/chat/completions", {"messages": messages}, backend)
        self.assertEqual(status, 200, text)
        prompt_len = len(ByteTokenizer().apply_chat_template(messages).encode())
        self.assertEqual(backend.configs[-1].max_new_tokens, Worker.max_seq_len - prompt_len)
        self.assertNotIn("X-Max-New-Tokens-Clamped", headers)  # nothing was asked, nothing lowered
        status, _, _ = await self.request("/v1/chat/completions", {"messages": messages, "max_tokens": 7}, backend)
        self.assertEqual(backend.configs[-1].max_new_tokens, 7)

    async def test_alternatives_in_openai_shapes(self):
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "logprobs": True, "top_logprobs": 2}
        status, _, text = await self.request("/v1/chat/completions", chat)
        self.assertEqual(status, 200, text)
        content = json.loads(text)["choices"][0]["logprobs"]["content"]
        self.assertEqual([c["token"] for c in content], ["a", "b", "c"])
        self.assertEqual(content[1]["top_logprobs"], [{"token": "b", "logprob": -0.5, "bytes": [98]},
                                                      {"token": "z", "logprob": -2.0, "bytes": [122]}])
        _, _, text = await self.request("/v1/chat/completions", dict(chat, stream=True))
        chunks = [json.loads(e[len("data: "):])["choices"][0] for e in text.split("\n\n")[:-2]]
        streamed = [c for ch in chunks if ch.get("logprobs") for c in ch["logprobs"]["content"]]
        self.assertEqual(streamed, content)
        status, _, text = await self.request("/v1/completions", {"prompt": "hi", "max_tokens": 4, "logprobs": 1})
        lp = json.loads(text)["choices"][0]["logprobs"]
        self.assertEqual((lp["tokens"], lp["token_logprobs"]), (["a", "b", "c"], [-0.5] * 3))
        self.assertEqual(lp["top_logprobs"], [{"a": -0.5}, {"b": -0.5}, {"c": -0.5}])
        _, _, text = await self.request("/v1/completions", {"prompt": "hi", "max_tokens": 4, "logprobs": 0})
        self.assertIsNone(json.loads(text)["choices"][0]["logprobs"]["top_logprobs"])

    async def test_completions_echo_the_prompt(self):
        body = {"prompt": "hi", "max_tokens": 4, "echo": True}
        status, _, text = await self.request("/v1/completions", body)
        self.assertEqual((status, json.loads(text)["choices"][0]["text"]), (200, "hiabc"))
        _, _, text = await self.request("/v1/completions", dict(body, prompt=[104, 105], stream=True))
        chunks = [json.loads(e[len("data: "):])["choices"][0] for e in text.split("\n\n")[:-2]]
        self.assertEqual("".join(c["text"] for c in chunks), "hiabc")

    async def test_completions_echo_with_logprobs_starts_with_the_prompts(self):
        backend = ScriptedBackend()
        body = {"prompt": "hi", "max_tokens": 4, "echo": True, "logprobs": 1}
        status, _, text = await self.request("/v1/completions", body, backend)
        choice = json.loads(text)["choices"][0]
        self.assertEqual((status, choice["text"]), (200, "hiabc"))
        self.assertEqual(backend.configs[0].prompt_logprobs.value, 1)
        lp = choice["logprobs"]
        self.assertEqual(lp["tokens"], ["h", "i", "a", "b", "c"])
        self.assertEqual(lp["token_logprobs"], [None, -1.0, -0.5, -0.5, -0.5])  # nothing precedes the first
        self.assertEqual(lp["top_logprobs"], [None, {"i": -1.0}, {"a": -0.5}, {"b": -0.5}, {"c": -0.5}])
        self.assertEqual(lp["text_offset"], [0, 1, 2, 3, 4])
        _, _, text = await self.request("/v1/completions", dict(body, stream=True))
        chunks = [json.loads(e[len("data: "):])["choices"][0] for e in text.split("\n\n")[:-2]]
        self.assertEqual("".join(c["text"] for c in chunks), "hiabc")
        self.assertEqual((chunks[0]["text"], chunks[0]["logprobs"]["token_logprobs"]), ("hi", [None, -1.0]))
        streamed = {key: [v for c in chunks for v in c["logprobs"][key]] for key in lp}
        self.assertEqual(streamed, lp)
        plain = ScriptedBackend()
        body.pop("logprobs")
        status, _, text = await self.request("/v1/completions", body, plain)  # no logprobs: none computed
        self.assertEqual((status, plain.configs[0].HasField("prompt_logprobs")), (200, False), text)

    async def test_logit_bias_reaches_the_engine(self):
        backend = ScriptedBackend()
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "logit_bias": {"97": -100, "5": 3}}
        status, _, text = await self.request("/v1/chat/completions", chat, backend)
        self.assertEqual(status, 200, text)
        self.assertEqual(dict(backend.configs[-1].logit_bias), {97: -100.0, 5: 3.0})
        status, _, text = await self.request("/", {"prompt": "hi", "generate_config": {"logit_bias": {"300": 1}}})
        self.assertEqual((status, json.loads(text)["message"].split(":")[0]), (400, "generate_config.logit_bias"))

    async def test_upstream_output_options_on_the_native_api(self):
        body = {"prompt": "hi", "generate_config": {"return_output_ids": True, "return_input_ids": True,
                                                    "return_cum_log_probs": True, "return_softmax_probs": True,
                                                    "num_beams": 1, "trace_id": "t"}}
        status, _, text = await self.request("/", body)
        self.assertEqual(status, 200, text)
        out = json.loads(text)
        self.assertEqual((out["output_ids"], out["input_ids"]), ([97, 98, 99], [104, 105]))
        self.assertEqual(out["aux_info"]["cum_log_probs"], [-1.5])
        self.assertEqual(len(out["aux_info"]["softmax_probs"]), 3)
        body["generate_config"].update(yield_generator=True, return_incremental=True)
        _, _, text = await self.request("/", body)
        events = [json.loads(e[len("data:"):]) for e in text.split("\n\n")[:-2]]
        self.assertEqual([e["output_ids"] for e in events], [[97], [98], [99]])
        self.assertEqual(events[-1]["aux_info"]["cum_log_probs"], [-1.5])
        status, _, text = await self.request("/", {"prompt": "hi", "generate_config": {"num_beams": 4}})
        self.assertEqual((status, json.loads(text)["message"].split(":")[0]), (400, "generate_config.num_beams"))

    async def test_a_thinking_budget_reaches_the_engine_with_the_end_tag(self):
        backend = ScriptedBackend()
        status, _, text = await self.request("/", {"prompt": "hi", "generate_config": {"max_thinking_tokens": 5}},
                                             backend)
        self.assertEqual(status, 200, text)
        p = backend.configs[-1]
        self.assertEqual((p.max_thinking_tokens, p.in_think_mode), (5, True))
        self.assertEqual(bytes(p.end_think_token_ids), b"</think>")  # the tag's tokens (one per byte here)
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "max_thinking_tokens": 5}
        status, _, text = await self.request(
            "/v1/chat/completions", dict(chat, chat_template_kwargs={"enable_thinking": False}), backend)
        self.assertEqual(status, 200, text)
        self.assertFalse(backend.configs[-1].in_think_mode)  # the template closed the thinking already
        status, _, text = await self.request("/v1/chat/completions", chat, backend)
        self.assertEqual(status, 200, text)
        self.assertTrue(backend.configs[-1].in_think_mode)

    async def test_what_is_not_supported_is_refused_not_ignored(self):
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for extra, param in [({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                             ({"tool_choice": "auto"}, "tool_choice"),
                             ({"logit_bias": {"999999": 100}}, "logit_bias"),  # not a token of the vocabulary
                             ({"logit_bias": {"5": 101}}, "logit_bias"),
                             ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
                             ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                             ({"echo": True}, "echo"),  # a completions field
                             ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role")]:
            status, _, text = await self.request("/v1/chat/completions", dict(chat, **extra))
            self.assertEqual((status, json.loads(text)["error"]["param"]), (400, param), extra)
        for asks_nothing in ({"response_format": {"type": "text"}}, {"tools": []}, {"tool_choice": "none"},
                             {"echo": False}, {"logit_bias": {}}):
            status, _, text = await self.request("/v1/chat/completions", dict(chat, **asks_nothing))
            self.assertEqual(status, 200, (asks_nothing, text))

    async def test_structured_output_reaches_the_engine_as_its_grammar(self):
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        for path, extra, kind, expected in [
                ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "json_schema",
                 json.dumps(JSON_OBJECT_SCHEMA)),
                ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
                    "name": "x", "schema": schema, "strict": True}}}, "json_schema", json.dumps(schema)),
                ("/v1/chat/completions", {"structured_outputs": {"regex": "a+"}}, "regex", "a+"),
                ("/v1/completions", {"structured_outputs": {"choice": ["a.b", "c"]}}, "regex", r"(a\.b)|(c)"),
                ("/v1/completions", {"structured_outputs": {"grammar": 'root ::= "x"'}}, "ebnf", 'root ::= "x"'),
                ("/v1/chat/completions", {"guided_json": schema, "stream": True}, "json_schema", json.dumps(schema)),
                ("/", {"generate_config": {"json_schema": schema}}, "json_schema", json.dumps(schema)),
                ("/", {"generate_config": {"response_format": {"type": "regex", "pattern": "[0-9]"}}}, "regex",
                 "[0-9]")]:
            with self.subTest(extra=extra):
                backend = ScriptedBackend()
                body = dict(chat, **extra) if path == "/v1/chat/completions" else dict(
                    {"prompt": "hi", "max_tokens": 4} if path == "/v1/completions" else {"prompt": "hi"}, **extra)
                status, _, text = await self.request(path, body, backend)
                self.assertEqual(status, 200, text)
                pb = backend.configs[-1]
                self.assertTrue(pb.HasField(kind), pb)
                self.assertEqual(getattr(pb, kind).value, expected)
                others = [k for k in GRAMMAR_FIELDS if k != kind and pb.HasField(k)]
                self.assertEqual(others, [])
        for asks_nothing in ({"response_format": {"type": "text"}}, {"structured_outputs": None}):
            backend = ScriptedBackend()
            status, _, text = await self.request("/v1/chat/completions", dict(chat, **asks_nothing), backend)
            self.assertEqual(status, 200, text)
            self.assertFalse(any(backend.configs[-1].HasField(k) for k in GRAMMAR_FIELDS))

    async def test_malformed_structured_output_is_a_400_naming_the_field(self):
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for extra, param in [({"response_format": "json"}, "response_format"),
                             ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
                             ({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}},
                              "response_format.json_schema.schema"),
                             ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
                             ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
                             ({"structured_outputs": {"what": 1}}, "structured_outputs.what"),
                             ({"guided_regex": 5}, "guided_regex"),
                             # a lone surrogate (JSON's "\ud800") has no UTF-8 form for the engine
                             ({"structured_outputs": {"regex": "\ud800"}}, "structured_outputs.regex"),
                             ({"structured_outputs": {"choice": ["a\udc00"]}}, "structured_outputs.choice"),
                             ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
                              "structured_outputs")]:
            status, _, text = await self.request("/v1/chat/completions", dict(chat, **extra))
            self.assertEqual((status, json.loads(text)["error"]["param"]), (400, param), extra)
        for cfg, field in [({"json_schema": "{not json"}, "generate_config.json_schema"),
                           ({"regex": "a", "ebnf": 'root ::= "a"'}, "generate_config.ebnf"),
                           ({"json_schema": {"enum": ["\ud800"]}}, "generate_config.json_schema"),
                           ({"response_format": {"type": "yaml"}}, "generate_config.response_format")]:
            status, _, text = await self.request("/", {"prompt": "hi", "generate_config": cfg})
            self.assertEqual(status, 400, text)
            self.assertTrue(json.loads(text)["message"].startswith(field), text)

    async def test_an_engine_grammar_error_names_the_request_s_field(self):
        # The engine's compile error is about its grammar field: named as the request set it.
        for path, body, param in [
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "#"}],
                                          "response_format": {"type": "json_object"}}, "response_format"),
                ("/v1/completions", {"prompt": "#", "structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
                ("/", {"prompt": "#", "generate_config": {"regex": "[a-"}}, "generate_config.regex"),
                ("/", {"prompt": "#", "generate_config": {"response_format": {"type": "regex", "pattern": "[a-"}}},
                 "generate_config.response_format")]:
            with self.subTest(body=body):
                status, _, text = await self.request(path, body)
                self.assertEqual(status, 400, text)
                out = json.loads(text)
                if path == "/":  # the native body names no param: the engine's message says the field
                    self.assertIn(param.rpartition(".")[2] if "response_format" not in param else "regex",
                                  out["message"])
                else:
                    self.assertEqual(out["error"]["param"], param)

    async def test_engine_errors_name_the_field_as_the_request_does(self):
        cases = [("/v1/completions", {"prompt": "!x"}, "prompt"),
                 ("/v1/chat/completions", {"messages": [{"role": "user", "content": "!"}]}, "messages"),
                 ("/v1/completions", {"prompt": "?x"}, "max_tokens")]
        for path, body, param in cases:
            with self.subTest(path=path, param=param):
                status, _, text = await self.request(path, body)
                self.assertEqual(status, 400, text)
                self.assertEqual(json.loads(text)["error"]["param"], param)

    async def test_native_prompt_batch_errors_keep_the_native_body(self):
        status, _, text = await self.request("/", {"prompt_batch": ["ok", "!x"]})
        self.assertEqual(status, 400, text)
        self.assertEqual(json.loads(text), {"error_code": 605, "error_code_str": "INVALID_PARAMS",
                                            "message": "token_ids must not be empty"})


if __name__ == "__main__":
    unittest.main()
