"""ReasoningSplitter: thinking goes to reasoning, the rest to content, tags in neither, whatever
the deltas' boundaries; an answer without the opening tag is all content."""

import unittest

from rtp_llm.config.output_parsers import REASONING_PARSERS
from rtp_llm.frontend.reasoning import ReasoningSplitter


def split(pieces):
    s = ReasoningSplitter(REASONING_PARSERS["qwen3"])
    parts = [s.add(p) for p in pieces] + [s.finish()]
    return "".join(r for r, _ in parts), "".join(c for _, c in parts), parts


class ReasoningTest(unittest.TestCase):
    def test_thinking_then_answer(self):
        reasoning, content, _ = split(["<think>\nLet me see.\n</think>\n\nParis."])
        self.assertEqual((reasoning, content), ("\nLet me see.\n", "\n\nParis."))

    def test_tags_split_across_every_delta_boundary(self):
        text = "  <think>a < b, so</think>The answer <is> b"
        for size in (1, 2, 3, 5):
            pieces = [text[i:i + size] for i in range(0, len(text), size)]
            reasoning, content, parts = split(pieces)
            self.assertEqual((reasoning, content), ("a < b, so", "The answer <is> b"), size)
            self.assertFalse(any("<think" in r + c or "</think" in r + c for r, c in parts))

    def test_an_answer_without_the_opening_tag_is_content(self):
        self.assertEqual(split(["Paris", " is the capital. </think>"])[:2], ("", "Paris is the capital. </think>"))
        self.assertEqual(split(["<thin", "g>"])[:2], ("", "<thing>"))
        self.assertEqual(split(["\n", "  "])[:2], ("", "\n  "))

    def test_reasoning_cut_off_before_its_end_stays_reasoning(self):
        self.assertEqual(split(["<think>still thinking </thi"])[:2], ("still thinking </thi", ""))

    def test_reasoning_streams_as_it_comes(self):
        _, _, parts = split(["<think>one", " two", "</think>", "three"])
        self.assertEqual(parts[:4], [("one", ""), (" two", ""), ("", ""), ("", "three")])


if __name__ == "__main__":
    unittest.main()
