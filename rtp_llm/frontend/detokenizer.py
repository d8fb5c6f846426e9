"""Incremental detokenization and stop strings for one generated sequence."""

from typing import List, Optional, Sequence


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas. A delta never ends inside a UTF-8
    character (the decoder yields U+FFFD until the character's last byte arrives), and text
    that could be the start of a stop string is held back until it is known not to be."""

    def __init__(self, tokenizer, stop: Sequence[str] = (), print_stop_words: bool = False):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.print_stop_words = print_stop_words
        self.ids: List[int] = []
        self.text = ""      # decoded so far (complete characters only)
        self.emitted = 0    # characters of `text` already handed out
        self.stopped = False

    def add(self, new_ids: Sequence[int]) -> str:
        """Appends tokens; returns the text that can be emitted now."""
        if self.stopped:
            return ""
        self.ids.extend(int(t) for t in new_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""  # an incomplete character: wait for its next byte
        self.text = text
        cut = self._stop_position()
        if cut is not None:
            self.stopped = True
            return self._emit(cut)
        hold = max((len(s) - 1 for s in self.stop), default=0)
        return self._emit(max(self.emitted, len(self.text) - self._partial_stop(hold)))

    def finish(self) -> str:
        """The held-back rest at the end of generation."""
        if self.stopped:
            return ""
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        delta = self.text[self.emitted:upto]
        self.emitted = max(self.emitted, upto)
        return delta

    def _stop_position(self) -> Optional[int]:
        # Only text not yet emitted (plus a stop string's length before it) can hold a new match.
        start = max(0, self.emitted - max((len(s) for s in self.stop), default=0))
        best = None
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0:
                end = i + len(s) if self.print_stop_words else i
                best = end if best is None else min(best, end)
        return best

    def _partial_stop(self, hold: int) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop string."""
        for n in range(min(hold, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
