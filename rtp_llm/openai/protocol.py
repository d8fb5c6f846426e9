"""OpenAI's response objects for /v1/completions and /v1/chat/completions: whole responses,
streamed chunks, choices, log-probs and usage, as the official client parses them."""

import time
import uuid
from typing import Dict, List, Optional


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Reply:
    """One request's response objects. chat: chat.completion(.chunk) rather than
    text_completion; tokenizer: to spell the tokens of log-probs, None when none were asked
    for (then "logprobs" is null); echo: the prompt's text that each completion choice starts
    with (completions' echo)."""

    def __init__(self, model: str, chat: bool, tokenizer=None, echo: str = ""):
        self.model, self.chat, self.tokenizer, self.echo = model, chat, tokenizer, echo
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self._offsets: Dict[int, int] = {}  # per choice: characters of its tokens rendered so far (text_offset)

    def completion(self, choices: List[dict], counts: dict) -> dict:
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": counts}

    def chunk(self, choices: List[dict], counts: Optional[dict], include_usage: bool) -> dict:
        payload = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                   "created": self.created, "model": self.model, "choices": choices}
        if include_usage:
            payload["usage"] = counts
        return payload

    def choice(self, index: int, text: str, finish_reason: str, pairs: List[tuple],
               reasoning: Optional[str] = None, calls: Optional[List[dict]] = None) -> dict:
        """A whole sequence; pairs: its (token id, log-prob, alternatives [(id, log-prob)] or
        None)s (SequenceEvent.logprobs); reasoning: its reasoning_content
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
        return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": self._logprobs(pairs, index)}

    @staticmethod
    def opening_delta(index: int) -> dict:
        """Chat's first chunk of a sequence: the assistant's turn, no text yet."""
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}

    def delta(self, index: int, text: str, finish_reason: Optional[str], pairs: List[tuple],
              reasoning: str = "") -> dict:
        """A streamed piece of a sequence (finish_reason set on its last); reasoning: its
        reasoning_content (chat)."""
        if self.chat:
            delta = {"reasoning_content": reasoning} if reasoning else {}
            if text:
                delta["content"] = text
            return {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": self._logprobs(pairs)}
        return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": self._logprobs(pairs, index)}

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

    def _logprobs(self, pairs: List[tuple], index: int = 0) -> Optional[dict]:
        """OpenAI's logprobs object: chat's content list (each token with its top_logprobs
        alternatives), completions' parallel lists (top_logprobs: a {token: log-prob} per token,
        null when none were asked for; the first prompt token's (echo) log-prob and alternatives
        null; text_offset: each token's character offset in the choice's text, echo included,
        counted across a stream's chunks)."""
        if self.tokenizer is None:
            return None
        spell = self._spell
        if self.chat:
            return {"content": [dict(self._entry(t, lp), top_logprobs=[self._entry(a, alp) for a, alp in top or ()])
                                for t, lp, top in pairs]}
        asked = any(top is not None for _, _, top in pairs)
        tokens = [spell(t) for t, _, _ in pairs]
        offsets, at = [], self._offsets.get(index, 0)
        for text in tokens:
            offsets.append(at)
            at += len(text)
        self._offsets[index] = at
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in pairs],
                "top_logprobs": [None if lp is None else {spell(a): alp for a, alp in top or ()}
                                 for _, lp, top in pairs] if asked else None,
                "text_offset": offsets}

    def _spell(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def _entry(self, token: int, logprob: float) -> dict:
        text = self._spell(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
