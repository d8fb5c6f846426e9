"""The OpenAPI 3.1 description of the HTTP API, served at GET /openapi.json (and read by the
fuzz test, tests/test_fuzz.py, to build its requests). The request fields' types, ranges and
descriptions are derived from their declarations (GenerateConfig, NATIVE_OPTIONS), which the
frontend enforces: anything outside them gets a 400 naming the field."""

from typing import Any, Dict, List

from rtp_llm.config.generate_config import INT32_MAX, MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, Range, request_fields
from rtp_llm.config.upstream_generate_fields import IGNORED, REFUSED
from rtp_llm.frontend.errors import ErrorCode
from rtp_llm.frontend.prompts import ROLES
from rtp_llm.frontend.request import MAX_SEQUENCES_PER_REQUEST, NATIVE_OPTIONS, OPENAI_NAMES, TokenIds


def _int(lo: int, hi: int = INT32_MAX, **kw) -> Dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi, **kw}


def _range(kind: str, r: Range) -> Dict[str, Any]:
    out = {"type": kind, "minimum": r.lo, "maximum": r.hi}
    if r.lo_open:
        out["exclusiveMinimum"] = r.lo
    return out


_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_STRINGS = {"type": "array", "items": _STR}
_TOKEN_IDS = {"type": "array", "items": _int(0), "minItems": 1}


_OBJECT = {"type": "object"}
# The grammar fields' shapes (config/grammar.py checks them; the engine compiles them).
_GRAMMAR = {"response_format": {"type": "object", "required": ["type"], "properties": {"type": {
                "type": "string", "enum": ["text", "json_object", "json_schema", "regex", "ebnf", "structural_tag"]}}},
            "json_schema": {"oneOf": [_OBJECT, {"type": "boolean"}, _STR]},
            "regex": dict(_STR, minLength=1), "ebnf": dict(_STR, minLength=1), "structural_tag": _OBJECT}


def field_schema(f) -> Dict[str, Any]:
    """The JSON schema of a GenerateConfig field (a dataclasses.Field), from its declaration:
    the annotation gives the type, the metadata the range and the description."""
    kind, r = f.type, f.metadata["range"]
    if f.name in _GRAMMAR:
        out = _GRAMMAR[f.name]
    elif kind is bool:
        out = dict(_BOOL)
    elif kind is float:
        out = _range("number", r)
    elif kind == List[List[int]]:  # the range bounds each token id
        out = {"type": "array", "items": {"type": "array", "items": _range("integer", r), "minItems": 1}}
    elif kind == List[int]:
        out = {"type": "array", "items": _range("integer", r)}
    elif kind == Dict[int, float]:  # token id -> number: the range bounds each number
        out = {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": _range("number", r),
               "maxProperties": MAX_LOGIT_BIAS}
    else:  # int, Optional[int]
        out = _range("integer", r)
    return dict(out, description=f.metadata["doc"])


_OPTION_KINDS = {
    bool: _BOOL, List[str]: _STRINGS, Dict[str, Any]: {"type": "object"},
    TokenIds: {"oneOf": [_int(0), {"type": "array", "items": _int(0)}]},
    List[List[int]]: {"type": "array", "items": {"type": "array", "items": _int(0), "minItems": 1}},
}


def _option_schema(kind, doc: str) -> Dict[str, Any]:
    return dict(_OPTION_KINDS[kind], description=doc)


_FIELDS = {f.name: field_schema(f) for f in request_fields()}
# Upstream's keys that change nothing here, and those refused unless they ask for nothing.
_UPSTREAM = {**{k: {"description": f"upstream's; accepted and ignored: {why}"} for k, why in IGNORED.items()},
             **{k: {"description": f"upstream's; refused (400) unless at its default: {why}"}
                for k, (_, why) in REFUSED.items()}}
_GENERATE_CONFIG = {
    "type": "object",
    "additionalProperties": False,
    "properties": {**_FIELDS, **{k: _option_schema(kind, doc) for k, (kind, doc) in NATIVE_OPTIONS.items()},
                   **_UPSTREAM},
}
# The OpenAI routes' sampling fields, by their OpenAI names.
_OPENAI_FIELDS = {theirs: _FIELDS[ours] for ours, theirs in OPENAI_NAMES.items()}

_MESSAGES = {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"type": "string", "enum": list(ROLES)}, "content": _STR}}}

_NATIVE = {
    "type": "object",
    "description": "One of prompt, prompt_batch or messages. Streams (text/event-stream) with yield_generator.",
    "properties": {
        "prompt": {"oneOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS]},
        "prompt_batch": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
                         "maxItems": MAX_SEQUENCES_PER_REQUEST},
        "messages": _MESSAGES,
        "chat_template_kwargs": {"type": "object"},
        "generate_config": {"$ref": "#/components/schemas/GenerateConfig"},
        "yield_generator": _BOOL,
        "stream": _BOOL,
    },
}

_OPENAI_COMMON = {
    "model": _STR,
    "stop": {"oneOf": [_STR, {"type": "array", "items": _STR, "maxItems": 16}]},
    "stream": _BOOL,
    "stream_options": {"type": "object", "properties": {"include_usage": _BOOL}},
    "response_format": {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
        "json_schema": {"type": "object", "required": ["schema"], "properties": {
            "name": _STR, "description": _STR, "schema": _OBJECT, "strict": _BOOL}}},
        "description": "the output is JSON (json_object: an object or array; json_schema: valid under the schema, "
                       "enforced whether or not strict)"},
    "structured_outputs": {"type": "object", "description": "vLLM's: exactly one of json (a schema), regex, choice "
                           "(strings), grammar (EBNF), json_object (true), structural_tag", "properties": {
        "json": {"oneOf": [_OBJECT, _STR]}, "regex": _STR, "choice": {"type": "array", "items": _STR, "minItems": 1},
        "grammar": _STR, "json_object": _BOOL, "structural_tag": _OBJECT}},
    **_OPENAI_FIELDS,
}

_CHAT = {
    "type": "object", "required": ["messages"],
    "properties": {
        "messages": _MESSAGES,
        "max_completion_tokens": _OPENAI_FIELDS["max_tokens"],
        "logprobs": _BOOL,
        "top_logprobs": _int(0, MAX_TOP_LOGPROBS, description="alternatives per token (needs logprobs: true)"),
        "chat_template_kwargs": {"type": "object"},
        **_OPENAI_COMMON,
    },
}

_COMPLETION = {
    "type": "object", "required": ["prompt"],
    "properties": {
        "prompt": {"oneOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS]},
        "logprobs": _int(0, MAX_TOP_LOGPROBS, description="the chosen token's log-prob and this many alternatives "
                                                          "(OpenAI allows up to 5, this server and vLLM 20)"),
        "echo": dict(_BOOL, description="each choice starts with the prompt's text; with logprobs its log-probs "
                                         "start with the prompt tokens' (the first one's null), from the model's raw "
                                         "distribution"),
        **_OPENAI_COMMON,
    },
}

_ERRORS = {
    "400": "bad input; the body names the field (native: message starts with it; OpenAI: error.param)",
    "401": "missing or wrong API key (--api_key)",
    "413": "body larger than --max_body_size",
    "429": "over --concurrency_limit or --max_queue_size (Retry-After: 1)",
    "500": f"the model step failed (error_code {int(ErrorCode.EXECUTION_EXCEPTION)}, the message says why)",
    "503": "starting, draining or unhealthy",
    "504": "timeout_ms (or --default_timeout_ms) expired",
}


def _post(summary: str, schema: str, streams: bool = True) -> Dict[str, Any]:
    ok = {"description": "the generation" + (" (text/event-stream when streaming)" if streams else ""),
          "content": {"application/json": {}, **({"text/event-stream": {}} if streams else {})}}
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}},
        "responses": {"200": ok, **{code: {"description": text, "content": {"application/json": {}}}
                                    for code, text in _ERRORS.items()}},
    }}


def openapi_spec(model_name: str = "rtp_llm") -> Dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "rtp_llm", "version": "1", "description": f"serving {model_name}"},
        "paths": {
            "/": _post("upstream RTP-LLM's native generate API", "NativeRequest"),
            "/v1/chat/completions": _post("OpenAI chat completions", "ChatCompletionRequest"),
            "/chat/completions": _post("OpenAI chat completions (upstream's route)", "ChatCompletionRequest"),
            "/v1/completions": _post("OpenAI completions", "CompletionRequest"),
            "/v1/models": {"get": {"summary": "the served model", "responses": {"200": {"description": "a list"}}}},
            "/health": {"get": {"summary": "200 when serving; 503 while starting or draining, when the backend is "
                                           "down, or when the engine made no step for --engine_stall_timeout_s "
                                           "with work pending",
                                "responses": {"200": {"description": "ok"}, "503": {"description": "why not"}}}},
        },
        "components": {"schemas": {"NativeRequest": _NATIVE, "GenerateConfig": _GENERATE_CONFIG,
                                   "ChatCompletionRequest": _CHAT, "CompletionRequest": _COMPLETION}},
    }
