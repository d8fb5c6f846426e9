"""Reasoning parsers (--reasoning_parser): a chat answer's thinking, split from its content,
as vLLM's and SGLang's parsers of the same names do. The split is OpenAI-compatible servers'
`reasoning_content`, in the message and in streamed deltas."""

from typing import Tuple

from rtp_llm.config.output_parsers import ThinkTags
from rtp_llm.frontend.detokenizer import partial_suffix


class ReasoningSplitter:
    """One sequence's text deltas as (reasoning, content) deltas. An answer that opens with the
    start tag (after whitespace) is reasoning until the end tag, content after it; one that
    does not is content. The tags themselves are in neither. A tag split across deltas is held
    back until it is whole, or known not to be the tag."""

    def __init__(self, tags: ThinkTags):
        self.tags = tags
        self.state = "opening"  # opening (not known yet) | reasoning | content
        self.held = ""

    def add(self, delta: str) -> Tuple[str, str]:
        text, self.held = self.held + delta, ""
        if self.state == "opening":
            opening = text.lstrip()
            if opening.startswith(self.tags.start):
                text, self.state = opening[len(self.tags.start):], "reasoning"
            elif self.tags.start.startswith(opening):  # whitespace, or the tag's beginning
                self.held = text
                return "", ""
            else:
                self.state = "content"
        reasoning = ""
        if self.state == "reasoning":
            i = text.find(self.tags.end)
            if i < 0:
                keep = partial_suffix(text, [self.tags.end])
                self.held = text[len(text) - keep:] if keep else ""
                return text[:len(text) - keep], ""
            reasoning, text, self.state = text[:i], text[i + len(self.tags.end):], "content"
        return reasoning, text

    def finish(self) -> Tuple[str, str]:
        """What was held back, at the end: unfinished reasoning stays reasoning."""
        held, self.held = self.held, ""
        return (held, "") if self.state == "reasoning" else ("", held)

    def last(self, delta: str) -> Tuple[str, str]:
        """add() of a sequence's last delta, then finish()."""
        (r1, c1), (r2, c2) = self.add(delta), self.finish()
        return r1 + r2, c1 + c2
