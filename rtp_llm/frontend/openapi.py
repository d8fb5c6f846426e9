"""The OpenAPI 3.1 description of the HTTP API, served at GET /openapi.json (and read by the
fuzz test, tests/test_fuzz.py, to build its requests). Ranges are the ones the frontend
enforces; anything outside them gets a 400 naming the field."""

from typing import Any, Dict

_INT32 = (1 << 31) - 1


def _int(lo: int, hi: int = _INT32, **kw) -> Dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi, **kw}


def _num(lo: float, hi: float, **kw) -> Dict[str, Any]:
    return {"type": "number", "minimum": lo, "maximum": hi, **kw}


_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_STRINGS = {"type": "array", "items": _STR}
_TOKEN_IDS = {"type": "array", "items": _int(0), "minItems": 1}

_SAMPLING = {  # shared by generate_config and the OpenAI routes (OpenAI names in the latter)
    "temperature": _num(0, 1e4, description="0 = greedy"),
    "top_p": _num(0, 1, exclusiveMinimum=0),
    "top_k": _int(0, description="0 = no cap; at least the vocabulary size = no cap"),
    "min_p": _num(0, 1),
    "repetition_penalty": _num(0.01, 100),
    "presence_penalty": _num(-2, 2),
    "frequency_penalty": _num(-2, 2),
    "ignore_eos": _BOOL,
}

_GENERATE_CONFIG = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "max_new_tokens": _int(1, description="clamped to the context left after the prompt (max_seq_len and "
                                              "the KV cache); aux_info.clamped_max_new_tokens and the "
                                              "X-Max-New-Tokens-Clamped header say so"),
        "min_new_tokens": _int(0),
        "num_return_sequences": _int(1, 64),
        **_SAMPLING,
        "random_seed": _int(0, (1 << 63) - 65),
        "stop_words_list": {"type": "array", "items": {"type": "array", "items": _int(-_INT32), "minItems": 1}},
        "stop_words_str": _STRINGS,
        "return_logprobs": _BOOL,
        "timeout_ms": _int(0, description="0 = the server's --default_timeout_ms (0 there: none)"),
        "yield_generator": _BOOL,
        "return_incremental": _BOOL,
        "print_stop_words": _BOOL,
        "is_streaming": _BOOL,
    },
}

_MESSAGES = {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"type": "string", "enum": ["system", "user", "assistant"]}, "content": _STR}}}

_NATIVE = {
    "type": "object",
    "description": "One of prompt, prompt_batch or messages. Streams (text/event-stream) with yield_generator.",
    "properties": {
        "prompt": {"oneOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS]},
        "prompt_batch": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
                         "maxItems": 64},
        "messages": _MESSAGES,
        "chat_template_kwargs": {"type": "object"},
        "generate_config": {"$ref": "#/components/schemas/GenerateConfig"},
        "yield_generator": _BOOL,
        "stream": _BOOL,
    },
}

_OPENAI_COMMON = {
    "model": _STR,
    "max_tokens": _int(1),
    "n": _int(1, 64),
    "seed": _int(0, (1 << 63) - 65),
    "stop": {"oneOf": [_STR, {"type": "array", "items": _STR, "maxItems": 16}]},
    "stream": _BOOL,
    "stream_options": {"type": "object", "properties": {"include_usage": _BOOL}},
    **_SAMPLING,
}

_CHAT = {
    "type": "object", "required": ["messages"],
    "properties": {
        "messages": _MESSAGES,
        "max_completion_tokens": _int(1),
        "logprobs": _BOOL,
        "top_logprobs": _int(0, 0, description="only the chosen token's log-prob is returned"),
        "chat_template_kwargs": {"type": "object"},
        **_OPENAI_COMMON,
    },
}

_COMPLETION = {
    "type": "object", "required": ["prompt"],
    "properties": {
        "prompt": {"oneOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS]},
        "logprobs": _int(0, 1),
        **_OPENAI_COMMON,
    },
}

_ERRORS = {
    "400": "bad input; the body names the field (native: message starts with it; OpenAI: error.param)",
    "401": "missing or wrong API key (--api_key)",
    "413": "body larger than --max_body_size",
    "429": "over --concurrency_limit or --max_queue_size (Retry-After: 1)",
    "500": "the model step failed (error_code 606, the message says why)",
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
