"""IncrementalDetokenizer: deltas never end inside a UTF-8 character, text that may begin a
stop string is held back until it is known not to, a stop string ends the text (kept with
print_stop_words), and finish() releases what was held."""

import unittest

from rtp_llm.frontend.detokenizer import IncrementalDetokenizer


class ByteTokenizer:
    """One token per UTF-8 byte; decoding an incomplete character gives U+FFFD, as byte-level
    BPE tokenizers (GPT-2, Qwen, SmolLM2) do."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


class SpaceMarkTokenizer:
    """SentencePiece-like: words are tokens that carry their leading space ("_world"), and a
    decode drops the space of its first token, so a token decoded alone loses what it shows
    after another one."""

    WORDS = ["_hello", "_world", ",", "_again", "!"]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.WORDS[i] for i in ids).replace("_", " ").lstrip(" ")


class CountingTokenizer(ByteTokenizer):
    """Counts the ids it is asked to decode."""

    def __init__(self):
        self.decoded = 0

    def decode(self, ids, skip_special_tokens=True):
        self.decoded += len(ids)
        return super().decode(ids, skip_special_tokens)


def ids(text: str):
    return list(text.encode())


def feed(detok, pieces):
    """The deltas of adding each piece (a list of token ids) in turn."""
    return [detok.add(p) for p in pieces]


class DetokenizerTest(unittest.TestCase):
    def test_a_split_character_waits_for_its_last_byte(self):
        d = IncrementalDetokenizer(ByteTokenizer())
        e_acute, emoji = ids("é"), ids("😀")
        self.assertEqual(feed(d, [ids("caf"), e_acute[:1]]), ["caf", ""])
        self.assertEqual(d.add(e_acute[1:]), "é")
        self.assertEqual(feed(d, [emoji[:1], emoji[1:3], emoji[3:]]), ["", "", "😀"])
        self.assertEqual(d.finish(), "")

    def test_text_without_stop_strings_comes_out_as_it_arrives(self):
        d = IncrementalDetokenizer(ByteTokenizer())
        self.assertEqual(feed(d, [ids("Hello"), ids(", "), ids("world")]), ["Hello", ", ", "world"])

    def test_a_stop_string_ends_the_text_and_is_left_out(self):
        d = IncrementalDetokenizer(ByteTokenizer(), stop=["STOP"])
        out = "".join(feed(d, [[b] for b in ids("one two STOP three")]))
        self.assertEqual(out, "one two ")
        self.assertTrue(d.stopped)
        self.assertEqual(d.add(ids("more")), "")
        self.assertEqual(d.finish(), "")

    def test_print_stop_words_keeps_the_stop_string(self):
        d = IncrementalDetokenizer(ByteTokenizer(), stop=["STOP"], print_stop_words=True)
        self.assertEqual("".join(feed(d, [ids("one ST"), ids("OP three")])), "one STOP")
        self.assertTrue(d.stopped)

    def test_a_stop_string_split_across_tokens_is_held_back_then_cut(self):
        d = IncrementalDetokenizer(ByteTokenizer(), stop=["</s>"])
        self.assertEqual(feed(d, [ids("a <"), ids("/"), ids("s>b")]), ["a ", "", ""])
        self.assertTrue(d.stopped)

    def test_a_held_back_prefix_that_is_no_stop_string_is_released(self):
        d = IncrementalDetokenizer(ByteTokenizer(), stop=["STOP"])
        self.assertEqual(feed(d, [ids("x ST"), ids("ART")]), ["x ", "START"])
        self.assertFalse(d.stopped)

    def test_a_partial_stop_string_at_the_end_comes_out_at_finish(self):
        d = IncrementalDetokenizer(ByteTokenizer(), stop=["STOP"])
        self.assertEqual(d.add(ids("end ST")), "end ")
        self.assertEqual(d.finish(), "ST")
        self.assertFalse(d.stopped)

    def test_the_earliest_of_several_stop_strings_wins(self):
        d = IncrementalDetokenizer(ByteTokenizer(), stop=["world", "lo w"])
        self.assertEqual(d.add(ids("hello world")), "hel")
        d = IncrementalDetokenizer(ByteTokenizer(), stop=["world", "lo w"], print_stop_words=True)
        self.assertEqual(d.add(ids("hello world")), "hello w")

    def test_empty_stop_strings_are_ignored(self):
        d = IncrementalDetokenizer(ByteTokenizer(), stop=["", "Z"])
        self.assertEqual(d.add(ids("abc")), "abc")
        self.assertFalse(d.stopped)

    def test_each_token_holds_back_the_longest_stop_prefix(self):
        # "b", then "bc", could begin "bcd": only "a" goes out until the stop string is whole.
        d = IncrementalDetokenizer(ByteTokenizer(), stop=["bcd"])
        self.assertEqual(feed(d, [ids("ab"), ids("c"), ids("d")]), ["a", "", ""])
        self.assertTrue(d.stopped)

    def test_a_token_keeps_the_space_it_has_after_the_one_before(self):
        tok = SpaceMarkTokenizer()
        d = IncrementalDetokenizer(tok)
        pieces = [[0], [1], [2], [3, 1], [4]]
        out = feed(d, pieces) + [d.finish()]
        self.assertEqual(out[:2], ["hello", " world"])
        self.assertEqual("".join(out), tok.decode([i for p in pieces for i in p]))

    def test_the_work_per_token_does_not_grow_with_the_sequence(self):
        # Each token costs a decode of a window of a few tokens, never of all the text so far.
        per_token = []
        for n in (256, 2048):
            tok = CountingTokenizer()
            d = IncrementalDetokenizer(tok, stop=["never"])
            text = "".join(feed(d, [[b] for b in ids("héllo wörld 😀 " * (n // 20))[:n]])) + d.finish()
            self.assertEqual(text, bytes(ids("héllo wörld 😀 " * (n // 20))[:n]).decode("utf-8", errors="replace"))
            per_token.append(tok.decoded / n)
        self.assertLess(per_token[1], 8)
        self.assertLess(per_token[1], per_token[0] * 1.1)

    def test_an_incomplete_last_character_comes_out_at_finish_as_a_whole_decode_gives_it(self):
        d = IncrementalDetokenizer(ByteTokenizer())
        self.assertEqual(feed(d, [ids("ab"), ids("é")[:1]]), ["ab", ""])
        self.assertEqual(d.finish(), "\ufffd")


if __name__ == "__main__":
    unittest.main()
