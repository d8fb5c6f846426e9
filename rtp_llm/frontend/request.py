"""Request fields: the JSON body, the native generate_config and the OpenAI sampling fields
into a GenerateConfig. Each engine field's type, default and range are declared once, in
rtp_llm/config/generate_config.py; this module only maps the API's names onto them and adds
the native options the frontend handles itself."""

import dataclasses
import json
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from aiohttp import web

from rtp_llm.config.generate_config import (INT32_MAX, GenerateConfig, GenerateConfigError, openai_names,
                                            token_id_key)
from rtp_llm.config.grammar import GRAMMAR_FIELDS
from rtp_llm.config.upstream_generate_fields import IGNORED, REFUSED, UNSET
from rtp_llm.frontend.errors import RequestError

# Sequences one request may start (prompt_batch x num_return_sequences).
MAX_SEQUENCES_PER_REQUEST = 64

TokenIds = Union[int, List[int]]

# Native generate_config keys the frontend handles itself (upstream's names; never sent to the
# engine as such): name -> (type, description). The OpenAPI text is derived from this too. The
# last three are translated into engine fields (translate_upstream).
NATIVE_OPTIONS = {
    "stop_words_str": (List[str], "text that ends generation (left out of the response unless print_stop_words)"),
    "print_stop_words": (bool, "keep a stop string that ended generation in the response"),
    "return_incremental": (bool, "streamed events carry the new text only, not all of it so far"),
    "yield_generator": (bool, "stream the response as server-sent events"),
    "is_streaming": (bool, "as yield_generator"),
    "skip_special_tokens": (bool, "leave special tokens out of the text (default true here; upstream's false)"),
    "return_output_ids": (bool, "the response carries output_ids: the generated token ids"),
    "return_input_ids": (bool, "the response carries input_ids: the prompt's token ids"),
    "return_cum_log_probs": (bool, "aux_info.cum_log_probs: [the sum of the generated tokens' log-probs]"),
    "return_softmax_probs": (bool, "aux_info.softmax_probs: each generated token's probability"),
    "chat_template_kwargs": (Dict[str, Any], "the chat template's extra arguments (a messages prompt)"),
    "do_sample": (bool, "false: greedy (temperature 0), whatever the sampling fields say"),
    "eos_token_id": (TokenIds, "token ids that end generation like EOS (each becomes a stop_words_list entry)"),
    "bad_words_list": (List[List[int]], "token id sequences never generated: single tokens only (each a "
                                        "logit_bias of -100)"),
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


def grammar_namer(config: GenerateConfig) -> Namer:
    """native_name, except that a grammar field is named as the request set it (response_format
    when the grammar came from there)."""
    source = config.grammar_source()
    return lambda key: native_name(source if key in GRAMMAR_FIELDS and source else key)


def native_config(body: Dict[str, Any]) -> Tuple[GenerateConfig, Dict[str, Any]]:
    """The native API's generate_config (its keys may also sit at the top level; the object's
    win): the engine's GenerateConfig and the frontend's options (NATIVE_OPTIONS). Upstream's
    other keys (config/upstream_generate_fields.py): ignored, or refused unless they ask for nothing."""
    cfg = body.get("generate_config", {})
    if not isinstance(cfg, dict):
        raise RequestError("generate_config", "must be an object")
    merged = {k: v for k, v in body.items() if k in GenerateConfig.__dataclass_fields__ or k in NATIVE_OPTIONS}
    merged.update(cfg)
    for k, unset in UNSET.items():
        if k in merged and merged[k] == unset and not isinstance(merged[k], bool):
            del merged[k]
    for k in IGNORED:
        merged.pop(k, None)
    for k, (asks_nothing, why) in REFUSED.items():
        if k in merged and not asks_nothing(merged.pop(k)):
            raise RequestError(native_name(k), f"{why}: refused rather than ignored")
    options = {k: merged.pop(k) for k in NATIVE_OPTIONS if k in merged}
    for k, (kind, _) in NATIVE_OPTIONS.items():
        if kind is bool:
            flag(options, k, native_name(k))
        elif kind is Dict[str, Any] and not isinstance(options.get(k, {}), dict):
            raise RequestError(native_name(k), "must be an object")
    return translate_upstream(make_config(merged, native_name), options), options


def _token_ids(v, field: str) -> List[int]:
    ids = [v] if not isinstance(v, list) else v
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT32_MAX for t in ids):
        raise RequestError(field, f"must be a token id or a list of token ids, got {v!r}"[:200])
    return ids


def translate_upstream(config: GenerateConfig, options: Dict[str, Any]) -> GenerateConfig:
    """Upstream's do_sample, eos_token_id and bad_words_list as the engine fields they amount to."""
    changes: Dict[str, Any] = {}
    if options.get("do_sample") is False:
        changes["temperature"] = 0.0
    if options.get("eos_token_id") is not None:
        eos = _token_ids(options["eos_token_id"], native_name("eos_token_id"))
        changes["stop_words_list"] = config.stop_words_list + [[t] for t in eos]
    if options.get("bad_words_list") is not None:
        words = _bad_words(options["bad_words_list"], native_name("bad_words_list"))
        changes["logit_bias"] = {**{token_id_key(k): v for k, v in config.logit_bias.items()},
                                 **{t: -100.0 for t in words}}
    return dataclasses.replace(config, **changes) if changes else config


def _bad_words(words, field: str) -> List[int]:
    """Upstream's bad_words_list ([[ids]], or per batch [[[ids]]]) as its tokens: single-token
    words only."""
    def lists(v):
        return isinstance(v, list) and all(isinstance(w, list) and w for w in v)

    if isinstance(words, list) and words and all(lists(batch) and batch for batch in words):
        words = [w for batch in words for w in batch]  # the per-batch form: its words are lists
    if not lists(words):
        raise RequestError(field, "must be a list of token id lists")
    if any(len(w) > 1 for w in words):
        raise RequestError(field, "only single-token bad words are supported: refused rather than ignored")
    return _token_ids([w[0] for w in words], field)


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
