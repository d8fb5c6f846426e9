"""A chat answer's text as the OpenAI API returns it: reasoning (--reasoning_parser), content
and tool calls (--tool_call_parser), whole or as it streams."""

from dataclasses import dataclass, field
from typing import List, Optional, Union

from rtp_llm.config.output_parsers import ThinkTags, ToolCallTags
from rtp_llm.frontend.reasoning import ReasoningSplitter
from rtp_llm.frontend.tool_calls import ForcedCalls, ForcedCallSplitter, ToolCallSplitter


@dataclass
class AnswerPiece:
    reasoning: str = ""
    content: str = ""
    calls: List[dict] = field(default_factory=list)


class AnswerSplitter:
    """One sequence's deltas as AnswerPieces: the reasoning parser first, then the tool-call
    parser on what is content (tags: calls in the text; ForcedCalls: the whole answer is the
    calls). Without parsers a piece is its delta as content."""

    def __init__(self, think: Optional[ThinkTags], tools: Union[ToolCallTags, ForcedCalls, None]):
        self.reasoning = ReasoningSplitter(think) if think else None
        self.tools = None if tools is None else (
            ForcedCallSplitter(tools) if isinstance(tools, ForcedCalls) else ToolCallSplitter(tools))
        self.num_calls = 0  # calls found so far: the stream's tool_calls indices

    def add(self, delta: str, last: bool = False) -> AnswerPiece:
        piece = AnswerPiece(content=delta)
        if self.reasoning:
            piece.reasoning, piece.content = self.reasoning.last(delta) if last else self.reasoning.add(delta)
        if self.tools:
            piece.content, piece.calls = (self.tools.last if last else self.tools.add)(piece.content)
        self.num_calls += len(piece.calls)
        return piece
