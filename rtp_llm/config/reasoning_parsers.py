"""--reasoning_parser's choices: the tags each one splits a chat answer's thinking by
(frontend/reasoning.py does the splitting)."""

from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class ThinkTags:
    start: str = "<think>"
    end: str = "</think>"


PARSERS: Dict[str, ThinkTags] = {"qwen3": ThinkTags(), "deepseek_r1": ThinkTags()}
