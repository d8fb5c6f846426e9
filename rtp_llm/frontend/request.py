"""Request fields: the JSON body, the native generate_config and the OpenAI sampling fields
into a GenerateConfig. Each engine field's type, default and range are declared once, in
rtp_llm/config/generate_config.py; this module only maps the API's names onto them and adds
the native options the frontend handles itself."""

import json
from typing import Any, Callable, Dict, List, Optional, Tuple

from aiohttp import web

from rtp_llm.config.generate_config import GenerateConfig, GenerateConfigError, openai_names, token_id_key
from rtp_llm.frontend.errors import RequestError

# Sequences one request may start (prompt_batch x num_return_sequences).
MAX_SEQUENCES_PER_REQUEST = 64

# Native generate_config keys the frontend handles itself (never sent to the engine):
# name -> (type, description). The OpenAPI text is derived from this too.
NATIVE_OPTIONS = {
    "stop_words_str": (List[str], "text that ends generation (left out of the response unless print_stop_words)"),
    "print_stop_words": (bool, "keep a stop string that ended generation in the response"),
    "return_incremental": (bool, "streamed events carry the new text only, not all of it so far"),
    "yield_generator": (bool, "stream the response as server-sent events"),
    "is_streaming": (bool, "as yield_generator"),
}

Namer = Callable[[str], str]  # a GenerateConfig field ("" = none) -> the request's name for it


async def read_json(request: web.Request) -> Dict[str, Any]:
    try:
        # Bytes, not text: json detects UTF-8/16/32 itself, whatever charset the header claims.
        body = json.loads(await request.read())
    except (ValueError, RecursionError) as e:  # bad JSON or encoding, digits beyond int's limit, deep nesting
        raise RequestError("body", f"not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(body, dict):
        raise RequestError("body", "must be a JSON object")
    return body


def flag(d: Dict[str, Any], key: str, field: str) -> bool:
    """An optional boolean field (null = false)."""
    v = d.get(key)
    if v is not None and not isinstance(v, bool):
        raise RequestError(field, f"must be a boolean, got {v!r}")
    return bool(v)


def make_config(d: Dict[str, Any], name: Namer) -> GenerateConfig:
    """GenerateConfig from request fields (GenerateConfig names); errors name the field as the
    request does (`name`)."""
    try:
        return GenerateConfig.from_dict(d)
    except GenerateConfigError as e:
        raise RequestError(name(e.field), e.reason) from None


def check_logit_bias(config: GenerateConfig, vocab_size: int, name: Namer) -> None:
    """logit_bias names tokens of the vocabulary (its range and types: GenerateConfig)."""
    bad = next((k for k in config.logit_bias if token_id_key(k) >= vocab_size), None)
    if bad is not None:
        raise RequestError(name("logit_bias"), f"token ids must be in [0, {vocab_size}), got {bad!r}"[:200])


def native_name(key: str) -> str:
    return f"generate_config.{key}" if key else "generate_config"


def native_config(body: Dict[str, Any]) -> Tuple[GenerateConfig, Dict[str, Any]]:
    """The native API's generate_config (its keys may also sit at the top level; the object's
    win): the engine's GenerateConfig and the frontend's options (NATIVE_OPTIONS)."""
    cfg = body.get("generate_config", {})
    if not isinstance(cfg, dict):
        raise RequestError("generate_config", "must be an object")
    merged = {k: v for k, v in body.items() if k in GenerateConfig.__dataclass_fields__ or k in NATIVE_OPTIONS}
    merged.update(cfg)
    options = {k: merged.pop(k) for k in NATIVE_OPTIONS if k in merged}
    for k, (kind, _) in NATIVE_OPTIONS.items():
        if kind is bool:
            flag(options, k, native_name(k))
    return make_config(merged, native_name), options


def stop_strings(options: Dict[str, Any]) -> List[str]:
    stop = options.get("stop_words_str") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError(native_name("stop_words_str"), "must be a list of strings")
    return stop


# GenerateConfig field -> its OpenAI name, for the fields the OpenAI API has.
OPENAI_NAMES = openai_names()


def openai_name(key: str) -> str:
    return OPENAI_NAMES.get(key, key or "body")


def openai_config(body: Dict[str, Any], default_max: Optional[int]) -> GenerateConfig:
    """The OpenAI request's sampling fields (null = absent) as a GenerateConfig; chat's
    max_completion_tokens wins over max_tokens."""
    cfg: Dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens", body.get(OPENAI_NAMES["max_new_tokens"], default_max))
    if max_tokens is not None:
        cfg["max_new_tokens"] = max_tokens
    for ours, theirs in OPENAI_NAMES.items():
        if ours != "max_new_tokens" and body.get(theirs) is not None:
            cfg[ours] = body[theirs]
    return make_config(cfg, openai_name)
