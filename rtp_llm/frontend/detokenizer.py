"""Incremental detokenization and stop strings for one generated sequence, at a cost per
token that does not grow with the sequence."""

from typing import Callable, List, Sequence

from tokenizers import Tokenizer  # (transformers' fast tokenizers are built on it)

_INCOMPLETE = "\ufffd"  # what a decoder yields for a character whose last byte has not come


def text_decoder(tokenizer) -> Callable:
    """tokenizer.decode, or the same through its fast backend directly (the `tokenizers`
    library's Tokenizer) when the result is the same: no clean-up of spaces to apply. That skips
    transformers' per-call conversions, most of a short decode's cost."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if isinstance(backend, Tokenizer) and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return backend.decode
    return tokenizer.decode


def partial_suffix(text: str, patterns: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `patterns`:
    text to hold back while it may still become one."""
    for n in range(min(max((len(s) - 1 for s in patterns), default=0), len(text)), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in patterns):
            return n
    return 0


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas. A delta never ends inside a UTF-8
    character, and text that could be the start of a stop string is held back until it is
    known not to be.

    Only a window of the ids is decoded per call: ids[prefix:read] are the tokens of the last
    delta, decoded again as context (a token's leading space, a character split across tokens,
    depend on the token before it), and the new text is what ids[prefix:] decode to beyond
    them. Stop strings are looked for in the held-back text only: text already out was known
    not to begin one."""

    def __init__(self, tokenizer, stop: Sequence[str] = (), print_stop_words: bool = False, decode=None,
                 skip_special_tokens: bool = True):
        self.decode = decode or text_decoder(tokenizer)
        self.skip_special = skip_special_tokens
        self.stop = [s for s in stop if s]
        self.print_stop_words = print_stop_words
        self.ids: List[int] = []
        self.prefix = 0      # ids[prefix:read]: the context decoded again with the new ids
        self.read = 0        # ids before this are in the text
        self.pending = ""    # decoded, not emitted: it may begin a stop string
        self.stopped = False

    def add(self, new_ids: Sequence[int]) -> str:
        """Appends tokens; returns the text that can be emitted now."""
        if self.stopped:
            return ""
        self.ids.extend(new_ids)
        return self._release(self._new_text(final=False))

    def finish(self) -> str:
        """The held-back rest at the end of generation (an incomplete character as U+FFFD,
        as decoding the whole sequence would give it)."""
        if self.stopped:
            return ""
        text = self._release(self._new_text(final=True))
        if not self.stopped:
            text, self.pending = text + self.pending, ""
        return text

    def _new_text(self, final: bool) -> str:
        skip = self.skip_special
        context = self.decode(self.ids[self.prefix:self.read], skip_special_tokens=skip) if self.read > self.prefix else ""
        text = self.decode(self.ids[self.prefix:], skip_special_tokens=skip)
        if not final and (len(text) <= len(context) or text.endswith(_INCOMPLETE)):
            return ""  # nothing new yet, or a character still waiting for its next byte
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(context):]

    def _release(self, delta: str) -> str:
        text = self.pending + delta
        cut = self._stop_position(text)
        if cut is not None:
            self.stopped, self.pending = True, ""
            return text[:cut]
        keep = partial_suffix(text, self.stop)
        self.pending = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def _stop_position(self, text: str):
        """Where the text ends at the earliest stop string (after it with print_stop_words)."""
        best = None
        for s in self.stop:
            i = text.find(s)
            if i >= 0:
                end = i + len(s) if self.print_stop_words else i
                best = end if best is None else min(best, end)
        return best
