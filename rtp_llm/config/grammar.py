"""Grammars a request's tokens must follow (structured output): the one declaration of their
kinds and of how each API's fields become one. The engine compiles and enforces them
(rtp_llm/async_decoder_engine/grammar.py, with xgrammar); here they are only shaped and
type-checked, so a frontend never imports xgrammar. A grammar that does not compile comes back
from the engine as a 400 naming the request's field.

Kinds, as GenerateConfigPB's fields (upstream's names; RTP_LLM_GRAMMAR_FIELDS in
rtp_llm/cpp/engine/generate_config.h): json_schema (a JSON Schema: an object or a boolean),
regex (xgrammar's regex syntax), ebnf (xgrammar's EBNF, rule `root` first), structural_tag
(xgrammar's structural tag object). Any caller (response_format, vLLM's structured_outputs,
a tool call's parameters) makes one with `Grammar.of` or the helpers below."""

import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")

# OpenAI's json_object: any JSON object or array (upstream's reading of "valid JSON").
JSON_OBJECT_SCHEMA = {"anyOf": [{"type": "object"}, {"type": "array"}]}


class GrammarError(ValueError):
    """A malformed grammar field: `field` names it (in the caller's naming), `reason` says why."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Grammar:
    kind: str  # one of GRAMMAR_FIELDS
    text: str  # what the engine compiles (JSON text for json_schema and structural_tag)

    @classmethod
    def of(cls, kind: str, value: Any, field: Optional[str] = None) -> "Grammar":
        """The grammar of kind `kind` from a request value (JSON kinds: the object itself or its
        JSON text); errors name `field` (default: the kind)."""
        field = field or kind
        if kind in ("json_schema", "structural_tag"):
            value = _json_value(value, field)
            if kind == "json_schema" and not isinstance(value, (dict, bool)):
                raise GrammarError(field, "must be a JSON Schema (an object or a boolean)")
            if kind == "structural_tag" and not isinstance(value, dict):
                raise GrammarError(field, "must be a structural tag object")
            return cls(kind, _unicode(json.dumps(value, ensure_ascii=False), field))
        if kind not in GRAMMAR_FIELDS:
            raise GrammarError(field, f"unknown grammar kind {kind!r} (known: {', '.join(GRAMMAR_FIELDS)})")
        if not isinstance(value, str) or not value.strip():
            raise GrammarError(field, "must be a non-empty string")
        return cls(kind, _unicode(value, field))


def _unicode(text: str, field: str) -> str:
    """text, which the engine receives as UTF-8: refused where it holds a lone surrogate (JSON's
    "\\ud800" escapes decode to one), which has no UTF-8 form."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GrammarError(field, f"is not valid Unicode text (an unpaired surrogate at position {e.start})") from None
    return text


def _json_value(value: Any, field: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError) as e:
            raise GrammarError(field, f"is not valid JSON ({e})") from None
    return value


def choice(options: Any, field: str) -> Grammar:
    """Exactly one of the strings `options` (vLLM's choice), as a regex of escaped literals."""
    if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
        raise GrammarError(field, "must be a non-empty list of non-empty strings")
    return Grammar("regex", _unicode("|".join(f"({_regex_literal(o)})" for o in options), field))


def _regex_literal(s: str) -> str:
    # xgrammar's regex escapes like ECMAScript's: a backslash before every metacharacter.
    return re.sub(r"([\\^$.|?*+()\[\]{}/-])", r"\\\1", s)


def literal_regex(s: str) -> str:
    """A regex matching exactly `s` (tests, and callers that pin an answer)."""
    return _regex_literal(s)


def response_format(value: Any, field: str = "response_format") -> Optional[Grammar]:
    """Upstream's and OpenAI's response_format: {"type": "text"} (none), "json_object",
    "json_schema" ({"json_schema": {"schema": ..., "name", "strict", "description"}}), and
    upstream's "regex" (pattern), "ebnf" (grammar), "structural_tag" (structural_tag)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = {"type": "text"} if value.strip() == "text" else _json_value(value, field)
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise GrammarError(field, 'must be an object with a "type" (text, json_object, json_schema, regex, ebnf, '
                                  'structural_tag)')
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.of("json_schema", JSON_OBJECT_SCHEMA, field)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise GrammarError(f"{field}.json_schema", 'must be an object with a "schema"')
        if spec.get("strict") not in (None, True, False):
            raise GrammarError(f"{field}.json_schema.strict", "must be a boolean")
        return Grammar.of("json_schema", spec["schema"], f"{field}.json_schema.schema")
    payload = {"regex": ("pattern", "regex"), "ebnf": ("grammar", "ebnf"),
               "structural_tag": ("structural_tag", "structural_tag")}.get(kind)
    if payload is None:
        raise GrammarError(f"{field}.type", f"unknown type {kind!r} (known: text, json_object, json_schema, regex, "
                                            f"ebnf, structural_tag)")
    key, grammar_kind = payload
    if kind == "structural_tag" and key not in value:  # the tag's fields inline, as OpenAI-style clients send it
        return Grammar.of(grammar_kind, value, field)
    return Grammar.of(grammar_kind, value.get(key), f"{field}.{key}")


# vLLM's structured_outputs keys -> how each becomes a grammar; guided_* are its older top-level
# names of the same.
STRUCTURED_OUTPUTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
GUIDED_NAMES = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                "guided_grammar": "grammar"}


def structured_outputs(value: Any, field: str = "structured_outputs") -> Optional[Grammar]:
    """vLLM's structured_outputs object: exactly one of json (a schema), regex, choice (a list
    of strings), grammar (EBNF), json_object (true), structural_tag."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise GrammarError(field, f"must be an object with one of {', '.join(STRUCTURED_OUTPUTS)}")
    unknown = sorted(k for k in value if k not in STRUCTURED_OUTPUTS and k not in _IGNORED_OPTIONS)
    if unknown:
        raise GrammarError(f"{field}.{unknown[0]}", f"is not supported (supported: {', '.join(STRUCTURED_OUTPUTS)})")
    set_keys = [k for k in STRUCTURED_OUTPUTS if value.get(k) not in (None, False)]
    if len(set_keys) != 1:
        raise GrammarError(field, f"must set exactly one of {', '.join(STRUCTURED_OUTPUTS)}"
                                  + (f" (got {', '.join(set_keys)})" if set_keys else ""))
    key = set_keys[0]
    v, name = value[key], f"{field}.{key}"
    if key == "json":
        return Grammar.of("json_schema", v, name)
    if key == "json_object":
        if v is not True:
            raise GrammarError(name, "must be true")
        return Grammar.of("json_schema", JSON_OBJECT_SCHEMA, name)
    if key == "choice":
        return choice(v, name)
    if key == "grammar":
        return Grammar.of("ebnf", v, name)
    return Grammar.of(key, v, name)  # regex, structural_tag


# structured_outputs options vLLM accepts that change nothing here (whitespace is compact by
# default: --constrained_json_disable_any_whitespace).
_IGNORED_OPTIONS = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties",
                    "whitespace_pattern")


def openai_grammar(body: Dict[str, Any]) -> Tuple[Optional[Grammar], str]:
    """The grammar an OpenAI request asks for (response_format, structured_outputs or a guided_*
    field; at most one) and the request field it came from ("" when none)."""
    found: List[Tuple[Grammar, str]] = []
    g = response_format(body.get("response_format"))
    if g is not None:
        found.append((g, "response_format"))
    g = structured_outputs(body.get("structured_outputs"))
    if g is not None:
        found.append((g, "structured_outputs"))
    for old, key in GUIDED_NAMES.items():
        if body.get(old) not in (None, False, [], {}):
            found.append((_guided_grammar(key, body[old], old), old))
    if len(found) > 1:
        raise GrammarError(found[1][1], f"only one structured output field may be set ({found[0][1]} is set too)")
    return found[0] if found else (None, "")


def _guided_grammar(key: str, value: Any, field: str) -> Grammar:
    try:
        return structured_outputs({key: value}, field)
    except GrammarError as e:  # named as the request has it: guided_json, not guided_json.json
        raise GrammarError(field, e.reason) from None
