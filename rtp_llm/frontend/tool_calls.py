"""Tool calls (--tool_call_parser): a chat request's tools, checked and handed to the chat
template, and the calls in the answer, found as the text streams. A call is the start tag, a
JSON object {"name": ..., "arguments": {...}}, the end tag (Hermes' format: Qwen2.5, Qwen3);
one whose JSON does not parse stays text. Text outside the tags is content.

tool_choice "required" or a named function is enforced by structured output instead (vLLM's
way): the answer is constrained to JSON, a named function's arguments or, for "required", an
array of {"name", "parameters"} objects, one per call, and becomes tool_calls whole."""

import json
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from rtp_llm.config.grammar import Grammar
from rtp_llm.config.output_parsers import ToolCallTags
from rtp_llm.frontend.detokenizer import partial_suffix
from rtp_llm.frontend.errors import RequestError


def request_tools(body: Dict[str, Any], tags: Optional[ToolCallTags]) -> Optional[List[dict]]:
    """The tools the chat template renders and the answer's calls are parsed for; None when the
    request offers none (or tool_choice is "none")."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice not in (None, "none", "auto", "required") and not isinstance(choice, dict):
        raise RequestError("tool_choice", 'must be "none", "auto", "required" or {"type": "function", ...}')
    if not tools:
        if choice not in (None, "none"):
            raise RequestError("tool_choice", "asks for a tool call, but the request has no tools")
        return None
    if tags is None:
        raise RequestError("tools", "tool calls need a server started with --tool_call_parser (e.g. hermes)")
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) and t["function"]["name"] for t in tools):
        raise RequestError("tools", 'must be a list of {"type": "function", "function": {"name": ..., '
                                    '"parameters": {...}}}')
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
            raise RequestError("tool_choice.function.name", "must name one of the request's tools")
    if body.get("parallel_tool_calls") not in (None, True, False):
        raise RequestError("parallel_tool_calls", "must be a boolean")
    return None if choice == "none" else tools


@dataclass(frozen=True)
class ForcedCalls:
    """A tool_choice that must yield calls: the grammar of the whole answer, and the function a
    named choice calls (None: "required", the answer is an array of calls)."""

    grammar: Grammar
    name: Optional[str]


def forced_calls(body: Dict[str, Any], tools: Optional[List[dict]]) -> Optional[ForcedCalls]:
    """tool_choice "required" or {"type": "function", "function": {"name": N}} (request_tools
    checked it): the JSON Schema the answer follows. parallel_tool_calls false: one call."""
    choice = body.get("tool_choice")
    if not tools or choice not in ("required",) and not isinstance(choice, dict):
        return None
    params = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools}
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        return ForcedCalls(Grammar.of("json_schema", params[name], "tools"), name)
    calls = {"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"const": n}, "parameters": p}, "required": ["name", "parameters"]}
        for n, p in params.items()]}}
    if body.get("parallel_tool_calls") is False:
        calls["maxItems"] = 1
    return ForcedCalls(Grammar.of("json_schema", calls, "tools"), None)


class ForcedCallSplitter:
    """A forced answer's deltas: nothing until the last, then its calls (an answer cut short,
    e.g. at max_tokens, that does not parse stays content)."""

    def __init__(self, forced: ForcedCalls):
        self.forced = forced
        self.text = ""

    def add(self, delta: str) -> Tuple[str, List[dict]]:
        self.text += delta
        return "", []

    def last(self, delta: str) -> Tuple[str, List[dict]]:
        text, self.text = self.text + delta, ""
        try:
            value = json.loads(text)
        except ValueError:
            return text, []
        if self.forced.name is not None:
            return "", [_make_call(self.forced.name, value)]
        if not isinstance(value, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                                  for c in value):
            return text, []
        return "", [_make_call(c["name"], c.get("parameters", {})) for c in value]


def template_messages(messages: Any) -> Any:
    """The messages as chat templates expect them: an assistant turn's tool call arguments as an
    object (the API sends them as a JSON string)."""
    if not isinstance(messages, list):
        return messages
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls:
            if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                      for c in calls):
                raise RequestError(f"messages[{i}].tool_calls", 'must be a list of {"function": {...}} objects')
            m = dict(m, tool_calls=[dict(c, function=dict(c["function"], arguments=_arguments(c["function"], i)))
                                    for c in calls])
        out.append(m)
    return out


def _arguments(function: dict, i: int) -> Any:
    args = function.get("arguments")
    if not isinstance(args, str):
        return args
    try:
        return json.loads(args)
    except ValueError:
        raise RequestError(f"messages[{i}].tool_calls", "function.arguments must be a JSON object") from None


class ToolCallSplitter:
    """One sequence's text deltas as (content, completed calls). From a start tag on, text is
    held back until its end tag; a start tag split across deltas is held back too."""

    def __init__(self, tags: ToolCallTags):
        self.tags = tags
        self.held = ""

    def add(self, delta: str) -> Tuple[str, List[dict]]:
        text, self.held = self.held + delta, ""
        content, calls = "", []
        while text:
            i = text.find(self.tags.start)
            if i < 0:
                keep = partial_suffix(text, [self.tags.start])
                content, self.held = content + text[:len(text) - keep], text[len(text) - keep:]
                break
            content += text[:i]
            j = text.find(self.tags.end, i)
            if j < 0:
                self.held = text[i:]
                break
            body, text = text[i + len(self.tags.start):j], text[j + len(self.tags.end):]
            call = _call(body)
            if call is None:
                content += self.tags.start + body + self.tags.end
            else:
                calls.append(call)
        return content, calls

    def last(self, delta: str) -> Tuple[str, List[dict]]:
        """add() of the last delta; an unfinished call is left as text."""
        content, calls = self.add(delta)
        content, self.held = content + self.held, ""
        return content, calls


def _call(body: str) -> Optional[dict]:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    return _make_call(obj["name"], obj.get("arguments", obj.get("parameters", {})))


def _make_call(name: str, args: Any) -> dict:
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else
                         json.dumps(args, ensure_ascii=False)}}
