"""Tool calls: the request's tools checked, the messages' call arguments made objects for the
template, and calls found in the answer whatever the deltas' boundaries; what does not parse
stays text."""

import json
import unittest

from rtp_llm.config.output_parsers import TOOL_CALL_PARSERS
from rtp_llm.frontend.errors import RequestError
from rtp_llm.frontend.tool_calls import (ForcedCallSplitter, ToolCallSplitter, forced_calls, request_tools,
                                         template_messages)

TAGS = TOOL_CALL_PARSERS["hermes"]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def split(pieces):
    s = ToolCallSplitter(TAGS)
    parts = [s.add(p) for p in pieces[:-1]] + [s.last(pieces[-1])]
    return "".join(c for c, _ in parts), [call for _, calls in parts for call in calls]


class ToolCallsTest(unittest.TestCase):
    def test_a_call_is_found_whatever_the_delta_boundaries(self):
        text = "Let me check. " + CALL + CALL.replace("Paris", "Lyon")
        for size in (1, 4, 7, len(text)):
            content, calls = split([text[i:i + size] for i in range(0, len(text), size)])
            self.assertEqual(content, "Let me check. ", size)
            self.assertEqual([c["function"]["name"] for c in calls], ["get_weather"] * 2)
            self.assertEqual([json.loads(c["function"]["arguments"]) for c in calls], [{"city": "Paris"},
                                                                                     {"city": "Lyon"}])
            self.assertTrue(all(c["id"].startswith("call_") and c["type"] == "function" for c in calls))

    def test_what_does_not_parse_or_never_ends_stays_text(self):
        self.assertEqual(split(["<tool_call>not json</tool_call> ok"]), ("<tool_call>not json</tool_call> ok", []))
        self.assertEqual(split(["a <tool_call>{\"name\": \"f\"", ""]), ("a <tool_call>{\"name\": \"f\"", []))
        self.assertEqual(split(["a <tool", "_cal"]), ("a <tool_cal", []))
        self.assertEqual(split(["x < y"]), ("x < y", []))

    def test_the_request_tools_are_checked(self):
        self.assertEqual(request_tools({"tools": [WEATHER]}, TAGS), [WEATHER])
        self.assertIsNone(request_tools({"tools": [WEATHER], "tool_choice": "none"}, TAGS))
        self.assertIsNone(request_tools({}, None))
        for body, field in [({"tools": [WEATHER]}, "tools"),  # (no parser: checked below with None)
                            ({"tools": [{"type": "function"}]}, "tools"),
                            ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
                             "tool_choice.function.name"),
                            ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice.function.name"),
                            ({"tool_choice": "auto"}, "tool_choice"),
                            ({"tools": [WEATHER], "tool_choice": 3}, "tool_choice"),
                            ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls")]:
            with self.subTest(body), self.assertRaises(RequestError) as e:
                request_tools(body, None if body == {"tools": [WEATHER]} else TAGS)
            self.assertEqual(e.exception.field, field)

    def test_required_and_named_choices_force_json_calls_of_the_tools(self):
        city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        tools = [dict(WEATHER, function=dict(WEATHER["function"], parameters=city)),
                 {"type": "function", "function": {"name": "now"}}]  # no parameters: any object
        self.assertIsNone(forced_calls({"tools": tools, "tool_choice": "auto"}, tools))
        self.assertIsNone(forced_calls({"tool_choice": "required"}, None))
        named = forced_calls({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
                             tools)
        self.assertEqual((named.grammar.kind, json.loads(named.grammar.text), named.name),
                         ("json_schema", city, "get_weather"))
        required = forced_calls({"tools": tools, "tool_choice": "required"}, tools)
        schema = json.loads(required.grammar.text)
        self.assertEqual((schema["type"], schema["minItems"], "maxItems" in schema, required.name),
                         ("array", 1, False, None))
        self.assertEqual([(o["properties"]["name"], o["properties"]["parameters"]) for o in schema["items"]["anyOf"]],
                         [({"const": "get_weather"}, city), ({"const": "now"}, {"type": "object"})])
        one = forced_calls({"tools": tools, "tool_choice": "required", "parallel_tool_calls": False}, tools)
        self.assertEqual(json.loads(one.grammar.text)["maxItems"], 1)

        def answer(forced, pieces):
            s = ForcedCallSplitter(forced)
            parts = [s.add(p) for p in pieces[:-1]] + [s.last(pieces[-1])]
            return "".join(c for c, _ in parts), [c["function"] for _, calls in parts for c in calls]

        self.assertEqual(answer(named, ['{"city":', ' "Paris"}']), ("", [{"name": "get_weather",
                                                                          "arguments": '{"city": "Paris"}'}]))
        self.assertEqual(answer(required, ['[{"name":"now","parameters":{}},', '{"name":"get_weather",'
                                           '"parameters":{"city":"Lyon"}}]']),
                         ("", [{"name": "now", "arguments": "{}"},
                               {"name": "get_weather", "arguments": '{"city": "Lyon"}'}]))
        self.assertEqual(answer(named, ['{"city": "Par']), ('{"city": "Par', []))  # cut short: stays content

    def test_call_arguments_in_the_history_become_objects_for_the_template(self):
        messages = [{"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
        out = template_messages(messages)
        self.assertEqual(out[1]["tool_calls"][0]["function"]["arguments"], {"city": "Paris"})
        self.assertEqual(messages[1]["tool_calls"][0]["function"]["arguments"], '{"city": "Paris"}')  # not mutated
        bad = [dict(messages[1], tool_calls=[{"function": {"name": "f", "arguments": "{oops"}}])]
        with self.assertRaises(RequestError) as e:
            template_messages(bad)
        self.assertEqual(e.exception.field, "messages[0].tool_calls")


if __name__ == "__main__":
    unittest.main()
