"""Per-request generation settings (upstream's generate_config names): the one declaration of
each request field. A field's type, default, range and description live in its metadata here;
its validation (`validate`), its proto form (`to_proto`), its OpenAI name and the OpenAPI text
(rtp_llm/frontend/openapi.py) are derived from them. Adding a sampling parameter here adds it to
the native API, the OpenAI API (when it has an OpenAI name), the OpenAPI document and the wire."""

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional, Tuple

from rtp_llm.config import grammar as grammars
from rtp_llm.config.grammar import Grammar, GrammarError
from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2 as pb

INT32_MAX = (1 << 31) - 1
# A sequence's seed is random_seed + its index (< 64, num_return_sequences' bound) in an int64.
SEED_MAX = (1 << 63) - 65


@dataclass(frozen=True)
class Range:
    """Closed [lo, hi], or (lo, hi] when lo_open. Bounds are what the int32 proto fields and the
    sampler's fp32 arithmetic can take: beyond them a value overflows the proto or turns logits
    into inf/nan."""

    lo: float
    hi: float
    lo_open: bool = False

    def __contains__(self, v) -> bool:
        return (self.lo < v if self.lo_open else self.lo <= v) and v <= self.hi

    def __str__(self) -> str:
        return f"{'(' if self.lo_open else '['}{self.lo}, {self.hi}]"


# How a field crosses to GenerateConfigPB, when not as the proto field of the same name.
SAME = "same"          # the proto field of the same name
SEED = "seed"          # Int64Value random_seed, plus the sequence index
ONE_PER_STREAM = "1"   # num_return_sequences: the frontend fans out one stream per sequence
TOKEN_LISTS = "rows"   # an IntMatrix of token id lists
GRAMMAR = "grammar"    # the grammar (at most one of these fields): its kind's StringValue (config/grammar.py)
TOKEN_MAP = "map"      # a map<int32, float> from token ids (ints or their decimal strings, as JSON keys)
INT32_WRAPPER = "i32"  # an Int32Value, set when not the default
OPTIONAL_INT32 = "i32?"  # an Int32Value, set when not None (0 is a value)

# Bounds the engine declares (rtp_llm/cpp/engine/step_batch_fields.h): alternatives per token,
# logit_bias entries per request.
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024


def _field(default, doc: str, range: Optional[Range] = None, openai: Optional[str] = "",
           proto: str = SAME, default_factory=None):
    """A request field. openai: its name in the OpenAI API ("" = the same, None = not there);
    proto: the GenerateConfigPB field it becomes (SAME, another name, or a conversion above)."""
    meta = {"doc": doc, "range": range, "openai": openai, "proto": proto}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


class GenerateConfigError(ValueError):
    """A bad generate_config: `field` names the key at fault, `reason` says what is wrong."""

    def __init__(self, field_name: str, reason: str):
        super().__init__(f"generate_config.{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


@dataclass
class GenerateConfig:
    # name: type = _field(default, description, range, openai=..., proto=...)
    max_new_tokens: int = _field(
        256, "at most this many new tokens; a server clamps it to the context left after the prompt and says so "
        "(aux_info.clamped_max_new_tokens, the X-Max-New-Tokens-Clamped header)", Range(1, INT32_MAX),
        openai="max_tokens")
    min_new_tokens: int = _field(
        0, "no EOS or stop token before this many new tokens", Range(0, INT32_MAX), openai=None)
    num_return_sequences: int = _field(
        1, "independent sequences generated for the prompt", Range(1, 64), openai="n", proto=ONE_PER_STREAM)
    temperature: float = _field(1.0, "0 = greedy", Range(0, 1e4))
    top_k: int = _field(0, "0 = no cap; at least the vocabulary size = no cap", Range(0, INT32_MAX))
    top_p: float = _field(
        1.0, "nucleus sampling: the smallest set of tokens with this much probability", Range(0, 1, lo_open=True))
    min_p: float = _field(0.0, "drop tokens less likely than this times the most likely one", Range(0, 1))
    repetition_penalty: float = _field(
        1.0, "HF's: logits of prompt and generated tokens divided by it (times it if negative); 1 = off",
        Range(0.01, 100))
    presence_penalty: float = _field(
        0.0, "OpenAI's: subtracted from the logits of tokens generated so far", Range(-2, 2))
    frequency_penalty: float = _field(
        0.0, "OpenAI's: times a token's count so far in the output, subtracted from its logit", Range(-2, 2))
    random_seed: Optional[int] = _field(
        None, "seeds sampling; sequence i of n uses random_seed + i", Range(0, SEED_MAX), openai="seed", proto=SEED)
    ignore_eos: bool = _field(False, "generate past EOS (stop token lists still apply)")
    stop_words_list: List[List[int]] = _field(
        None, "token id sequences that end generation", Range(-INT32_MAX, INT32_MAX), openai=None,
        proto=TOKEN_LISTS, default_factory=list)
    return_logprobs: bool = _field(
        False, "return the log-prob of each generated token", openai=None, proto="return_softmax_probs")
    top_logprobs: int = _field(
        0, "also return this many most likely alternatives (token, log-prob) of each generated token, from the "
        "distribution it was sampled from (after penalties, logit_bias and temperature; before top-k/top-p/min-p)",
        Range(0, MAX_TOP_LOGPROBS), openai=None)
    prompt_logprobs: Optional[int] = _field(
        None, "vLLM's: also return each prompt token's log-prob (the first token's is null) and this many most "
        "likely alternatives, from the model's raw distribution (no penalties, logit_bias or temperature), in "
        "aux_info.prompt_logprobs / prompt_top_logprobs; null = off. The prompt then runs whole (no prefix-cache "
        "reuse)", Range(0, MAX_TOP_LOGPROBS), openai=None, proto=OPTIONAL_INT32)
    logit_bias: Dict[int, float] = _field(
        None, f"token id -> bias added to its logit before sampling (at most {MAX_LOGIT_BIAS} entries; -100 bans "
        "a token, 100 all but forces it)", Range(-100, 100), proto=TOKEN_MAP, default_factory=dict)
    timeout_ms: int = _field(
        0, "0 = the server's --default_timeout_ms (0 there: none)", Range(0, INT32_MAX), openai=None)
    # Structured output (upstream's fields; at most one): the engine keeps the output in the
    # grammar. OpenAI's response_format / structured_outputs are read by the OpenAI route.
    response_format: Any = _field(
        None, 'the output\'s format: {"type": "text" | "json_object" | "json_schema" (json_schema.schema) | '
        '"regex" (pattern) | "ebnf" (grammar) | "structural_tag" (structural_tag)}', openai=None, proto=GRAMMAR)
    json_schema: Any = _field(
        None, "the output is JSON valid under this JSON Schema (an object, a boolean, or its JSON text)",
        openai=None, proto=GRAMMAR)
    regex: Optional[str] = _field(None, "the output matches this regular expression (xgrammar's syntax)",
                                  openai=None, proto=GRAMMAR)
    ebnf: Optional[str] = _field(None, "the output follows this EBNF grammar (xgrammar's syntax, rule root)",
                                 openai=None, proto=GRAMMAR)
    structural_tag: Any = _field(None, "the output follows this xgrammar structural tag", openai=None,
                                 proto=GRAMMAR)
    no_repeat_ngram_size: int = _field(
        0, "HF's: no n-gram of this size occurs twice in the prompt and output; 0 = off", Range(0, INT32_MAX),
        proto=INT32_WRAPPER)
    max_thinking_tokens: int = _field(
        0, "upstream's thinking budget: after this many tokens inside the thinking, its end tag is forced; 0 = "
        "none. The thinking starts with the output (in_think_mode; implied by a budget) and ends at "
        "end_think_token_ids (default: the tokens of </think>)", Range(0, INT32_MAX))
    in_think_mode: bool = _field(False, "the output starts inside the thinking (upstream's)", openai=None)
    end_think_token_ids: List[int] = _field(
        None, "the tokens that end the thinking (upstream's)", Range(0, INT32_MAX), openai=None,
        default_factory=list)
    force_disable_sp_run: bool = _field(
        False, "upstream's: this request never drafts (speculative decoding, --sp_type, is off for it); its text "
        "is the same either way", openai=None)

    @classmethod
    def from_dict(cls, d: Optional[Dict[str, Any]]) -> "GenerateConfig":
        d = dict(d or {})
        unknown = sorted(k for k in d if k not in _FIELD_NAMES)
        if unknown:
            raise GenerateConfigError(unknown[0], f"unknown field (known: {', '.join(sorted(_FIELD_NAMES))})")
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raises GenerateConfigError naming the first field (in declaration order) whose value
        has the wrong type, else the first out of its range."""
        values = [(c, getattr(self, c.name)) for c in _CHECKS]
        for reason_of in (lambda c, v: c.type_error(v), lambda c, v: c.range_error(v)):
            for c, v in values:
                reason = reason_of(c, v)
                if reason:
                    raise GenerateConfigError(c.name, reason)
        self.grammar()

    def grammar(self) -> Optional[Grammar]:
        """The grammar the output follows (from response_format or a grammar field), or None;
        GenerateConfigError when more than one is set."""
        found = [(name, _grammar_of(name, getattr(self, name))) for name in _GRAMMAR_NAMES
                 if getattr(self, name) is not None]
        found = [(name, g) for name, g in found if g is not None]
        if len(found) > 1:
            raise GenerateConfigError(found[1][0], f"only one of {', '.join(_GRAMMAR_NAMES)} may be set "
                                                   f"({found[0][0]} is set too)")
        return found[0][1] if found else None

    def grammar_source(self) -> str:
        """The field the grammar came from (response_format, or the grammar's own field)."""
        return "response_format" if self.response_format is not None else next(
            (n for n in grammars.GRAMMAR_FIELDS if getattr(self, n) is not None), "")

    def to_proto(self, sequence_index: int = 0) -> pb.GenerateConfigPB:
        """The proto for sequence `sequence_index` of num_return_sequences (its own stream)."""
        c = pb.GenerateConfigPB(**{proto: getattr(self, name) for name, proto in _PLAIN_PROTO})
        for check in _SPECIAL_PROTO:
            v, proto = getattr(self, check.name), check.proto
            if proto == SEED:
                if v is not None:
                    c.random_seed.value = v + sequence_index
            elif proto == ONE_PER_STREAM:
                setattr(c, check.name, 1)
            elif proto == TOKEN_LISTS:
                for words in v:
                    c.stop_words_list.rows.add(values=words)
            elif proto == TOKEN_MAP:
                for token, bias in v.items():
                    getattr(c, check.name)[int(token)] = bias
            elif proto == INT32_WRAPPER:
                if v:
                    getattr(c, check.name).value = v
            elif proto == OPTIONAL_INT32:
                if v is not None:
                    getattr(c, check.name).value = v
        g = self.grammar()
        if g is not None:
            getattr(c, g.kind).value = g.text
        return c


def request_fields() -> Tuple:
    """The declared fields (dataclasses.Field), in declaration order."""
    return fields(GenerateConfig)


def openai_names() -> Dict[str, str]:
    """GenerateConfig field -> its OpenAI request name, for the fields the OpenAI API has."""
    out = {}
    for f in fields(GenerateConfig):
        name = f.metadata["openai"]
        if name is not None:
            out[f.name] = name or f.name
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_finite_number(v) -> bool:
    # abs() first: a huge int has no float form for isfinite.
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= 1e300 and math.isfinite(v))


def _type_check(kind) -> Callable[[Any], Optional[str]]:
    """What is wrong with the type of a value of annotation `kind`, as a function of the value
    (None: nothing)."""
    if kind is bool:
        return lambda v: None if isinstance(v, bool) else "must be a boolean"
    if kind == List[List[int]]:
        return lambda v: None if (isinstance(v, list) and all(
            isinstance(w, list) and w and all(_is_int(t) for t in w) for w in v)) else (
                f"must be a list of non-empty token id lists, got {v!r}")
    if kind is float:
        return lambda v: None if _is_finite_number(v) else f"must be a finite number, got {v!r}"
    if kind == Dict[int, float]:
        return _token_map_error
    if kind == List[int]:
        return lambda v: None if isinstance(v, list) and all(_is_int(t) for t in v) else (
            f"must be a list of token ids, got {v!r}"[:200])
    optional = kind == Optional[int]
    return lambda v: None if (optional and v is None) or _is_int(v) else f"must be an integer, got {v!r}"


def token_id_key(k) -> Optional[int]:
    """A token id map's key as an int (JSON keys are strings), None when it is not one."""
    if _is_int(k):
        return k
    if isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 10:
        return int(k)
    return None


def _token_map_error(v) -> Optional[str]:
    if not isinstance(v, dict):
        return f"must be an object of token id -> number, got {v!r}"[:200]
    if len(v) > MAX_LOGIT_BIAS:
        return f"may have at most {MAX_LOGIT_BIAS} entries, got {len(v)}"
    for k, x in v.items():
        t = token_id_key(k)
        if t is None or t > INT32_MAX:
            return f"keys must be token ids (non-negative integers), got {k!r}"[:200]
        if not _is_finite_number(x):
            return f"values must be finite numbers, got {x!r} for {k!r}"[:200]
    return None


def _range_check(rng: Optional[Range], token_lists: bool, token_map: bool,
                 token_ids: bool) -> Callable[[Any], Optional[str]]:
    """What is wrong with a value (of the right type) for `rng`, as a function of the value. A
    list of token id lists has the range on each token id, a token id map on each value."""
    if rng is None:
        return lambda v: None
    if token_lists:
        def check(v):
            bad = next((t for w in v for t in w if t not in rng), None)
            return None if bad is None else f"token ids must be in {rng}, got {bad!r}"
        return check
    if token_ids:
        return lambda v: next((f"token ids must be in {rng}, got {t!r}" for t in v if t not in rng), None)
    if token_map:
        def check_values(v):
            bad = next((k for k, x in v.items() if x not in rng), None)
            return None if bad is None else f"values must be in {rng}, got {v[bad]!r} for {bad!r}"
        return check_values
    return lambda v: None if v is None or v in rng else f"must be in {rng}, got {v!r}"


def _grammar_of(name: str, value) -> Optional[Grammar]:
    """The grammar a grammar field's value stands for (None: response_format text)."""
    if name == "response_format":
        return grammars.response_format(value)
    return Grammar.of(name, value)


def _grammar_check(name: str) -> Callable[[Any], Optional[str]]:
    def check(v):
        if v is None:
            return None
        try:
            _grammar_of(name, v)
        except GrammarError as e:
            return e.reason if e.field == name else f"{e.field}: {e.reason}"
        return None
    return check


@dataclass(frozen=True)
class _FieldCheck:
    """One declared field's checks and proto conversion, derived once from its declaration
    (validate and to_proto run for every request)."""

    name: str
    type_error: Callable[[Any], Optional[str]]
    range_error: Callable[[Any], Optional[str]]
    proto: str


_CHECKS = tuple(_FieldCheck(f.name, _grammar_check(f.name) if f.metadata["proto"] == GRAMMAR else _type_check(f.type),
                            _range_check(f.metadata["range"], f.type == List[List[int]], f.type == Dict[int, float],
                                         f.type == List[int]), f.metadata["proto"])
                for f in fields(GenerateConfig))
_FIELD_NAMES = frozenset(c.name for c in _CHECKS)
# (field, proto field) of the fields that cross as a plain value (one constructor call per request).
_SPECIAL_PROTO = tuple(c for c in _CHECKS if c.proto in (SEED, ONE_PER_STREAM, TOKEN_LISTS, TOKEN_MAP, INT32_WRAPPER,
                                                              OPTIONAL_INT32))
_GRAMMAR_CHECKS = tuple(c for c in _CHECKS if c.proto == GRAMMAR)
_GRAMMAR_NAMES = tuple(c.name for c in _GRAMMAR_CHECKS)
_PLAIN_PROTO = tuple((c.name, c.name if c.proto == SAME else c.proto) for c in _CHECKS
                     if c not in _SPECIAL_PROTO and c not in _GRAMMAR_CHECKS)
