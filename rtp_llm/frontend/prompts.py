"""Prompts to token ids: text, token id lists and chat messages (through the tokenizer's chat
template), and fitting a prompt and its max_new_tokens into the context."""

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from rtp_llm.config.generate_config import GenerateConfig
from rtp_llm.frontend.errors import ErrorCode, RequestError


# A chat message's roles, as OpenAI's API names them (the chat template renders them).
ROLES = ("system", "developer", "user", "assistant", "tool")


class Prompts:
    """Errors name the request field the prompt came from (`field`)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer) if tokenizer is not None else 0

    def tokenize(self, text: str, field: str, special: bool) -> List[int]:
        try:
            return list(self.tokenizer(text, add_special_tokens=special).input_ids)
        except Exception as e:  # e.g. lone surrogates, which no tokenizer can encode
            raise RequestError(field, f"cannot be tokenized ({type(e).__name__})") from None

    def encode(self, text: Any, field: str, special: bool = True) -> List[int]:
        """A prompt given as text or as token ids."""
        if isinstance(text, list) and text and all(isinstance(t, int) and not isinstance(t, bool) for t in text):
            if not all(0 <= t < self.vocab_size for t in text):
                raise RequestError(field, f"token ids must be in [0, {self.vocab_size})")
            return text
        if not isinstance(text, str) or not text:
            raise RequestError(field, "must be a non-empty string")
        return self.tokenize(text, field, special)

    def chat_ids(self, messages: Any, kwargs: Dict[str, Any], tools: Optional[List[dict]] = None) -> List[int]:
        """`messages` through the chat template (kwargs: chat_template_kwargs; tools: the
        functions the template offers the model), with the assistant's turn opened."""
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise RequestError("messages", "must be a non-empty list of {role, content} objects")
        for i, m in enumerate(messages):
            if m["role"] not in ROLES:
                raise RequestError(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}, got {m['role'][:40]!r}")
        if not isinstance(kwargs, dict):
            raise RequestError("chat_template_kwargs", "must be an object")
        try:
            if tools is not None:
                kwargs = dict(kwargs, tools=tools)
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        except Exception as e:
            raise RequestError("messages", f"cannot apply the chat template: {str(e)[:200]}") from None
        return self.tokenize(text, "messages", False)


def fit(prompt_ids: List[int], config: GenerateConfig, field: str, context_len: Optional[int],
        default_timeout_ms: int, vocab_size: int, fill: bool = False) -> Tuple[GenerateConfig, Optional[int]]:
    """Checks the prompt (at least one token, fewer than the context holds: context_len =
    min(max_seq_len, KV capacity), None while unknown) and clamps max_new_tokens to what is left
    of the context; returns the config to run and the clamped value (None if unchanged). fill:
    the request set no limit, and max_new_tokens is what is left of the context (not a clamp).
    Also applies the server's default timeout and caps top_k at the vocabulary (larger means no
    cap)."""
    n, limit = len(prompt_ids), context_len
    if n == 0:  # e.g. only control characters the tokenizer drops
        raise RequestError(field, "has no tokens once tokenized; the engine needs at least one")
    if limit is not None and n >= limit:
        raise RequestError(field, f"has {n} tokens; the context holds {limit} (max_seq_len and KV cache), "
                                  f"and room for at least one new token is needed", 400, ErrorCode.LONG_PROMPT_ERROR)
    changes: Dict[str, Any] = {}
    if config.timeout_ms == 0 and default_timeout_ms:
        changes["timeout_ms"] = default_timeout_ms
    if config.top_k >= vocab_size > 0:
        changes["top_k"] = 0
    clamped = None
    if limit is not None and (fill or config.max_new_tokens > limit - n):
        changes["max_new_tokens"] = limit - n
        changes["min_new_tokens"] = min(config.min_new_tokens, limit - n)
        clamped = None if fill else limit - n
    return (dataclasses.replace(config, **changes) if changes else config), clamped
