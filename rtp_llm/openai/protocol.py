"""OpenAI's response objects for /v1/completions and /v1/chat/completions: whole responses,
streamed chunks, choices, log-probs and usage, as the official client parses them."""

import time
import uuid
from typing import List, Optional, Tuple


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Reply:
    """One request's response objects. chat: chat.completion(.chunk) rather than
    text_completion; tokenizer: to spell the tokens of log-probs, None when none were asked
    for (then "logprobs" is null)."""

    def __init__(self, model: str, chat: bool, tokenizer=None):
        self.model, self.chat, self.tokenizer = model, chat, tokenizer
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def completion(self, choices: List[dict], counts: dict) -> dict:
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": counts}

    def chunk(self, choices: List[dict], counts: Optional[dict], include_usage: bool) -> dict:
        payload = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                   "created": self.created, "model": self.model, "choices": choices}
        if include_usage:
            payload["usage"] = counts
        return payload

    def choice(self, index: int, text: str, finish_reason: str, pairs: List[Tuple[int, float]],
               reasoning: Optional[str] = None, calls: Optional[List[dict]] = None) -> dict:
        """A whole sequence; pairs: its (token id, log-prob)s; reasoning: its reasoning_content
        (chat with a reasoning parser; None: no such field); calls: its tool calls (then a
        content of only whitespace is null)."""
        if self.chat:
            message = {"role": "assistant", "content": None if calls and not text.strip() else text}
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = calls
            return {"index": index, "message": message, "finish_reason": finish_reason,
                    "logprobs": self._logprobs(pairs)}
        return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": self._logprobs(pairs)}

    @staticmethod
    def opening_delta(index: int) -> dict:
        """Chat's first chunk of a sequence: the assistant's turn, no text yet."""
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}

    def delta(self, index: int, text: str, finish_reason: Optional[str], pairs: List[Tuple[int, float]],
              reasoning: str = "") -> dict:
        """A streamed piece of a sequence (finish_reason set on its last); reasoning: its
        reasoning_content (chat)."""
        if self.chat:
            delta = {"reasoning_content": reasoning} if reasoning else {}
            if text:
                delta["content"] = text
            return {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": self._logprobs(pairs)}
        return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": self._logprobs(pairs)}

    @staticmethod
    def tool_call_deltas(index: int, k: int, call: dict) -> List[dict]:
        """A streamed tool call (the sequence's k-th) as OpenAI streams one: its id, type and name,
        then its arguments."""
        fn = call["function"]
        return [{"index": index, "delta": {"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                                           "function": {"name": fn["name"], "arguments": ""}}]},
                 "finish_reason": None, "logprobs": None},
                {"index": index, "delta": {"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]},
                 "finish_reason": None, "logprobs": None}]

    def _logprobs(self, pairs: List[Tuple[int, float]]) -> Optional[dict]:
        if self.tokenizer is None:
            return None
        tokens = [self.tokenizer.decode([t]) for t, _ in pairs]
        if self.chat:
            return {"content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
                                for tok, (_, lp) in zip(tokens, pairs)]}
        return {"tokens": tokens, "token_logprobs": [lp for _, lp in pairs], "top_logprobs": None,
                "text_offset": None}
