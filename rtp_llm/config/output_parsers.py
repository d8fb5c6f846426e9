"""The output parsers' choices (--reasoning_parser, --tool_call_parser): the tags each one finds
in a chat answer (frontend/reasoning.py and frontend/tool_calls.py do the parsing)."""

from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class ThinkTags:
    start: str = "<think>"
    end: str = "</think>"


@dataclass(frozen=True)
class ToolCallTags:
    """A call is `start {"name": ..., "arguments": {...}} end` (Hermes' format, Qwen2.5's and Qwen3's)."""
    start: str = "<tool_call>"
    end: str = "</tool_call>"


REASONING_PARSERS: Dict[str, ThinkTags] = {"qwen3": ThinkTags(), "deepseek_r1": ThinkTags()}
TOOL_CALL_PARSERS: Dict[str, ToolCallTags] = {"hermes": ToolCallTags(), "qwen": ToolCallTags()}
