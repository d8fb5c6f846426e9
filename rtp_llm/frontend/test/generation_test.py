"""generate_sequences: what arrived together is one event, --stream_interval paces events
(first and last never delayed), a non-streamed request asks the engine for one message unless
stop strings need every token, and a stop string closes the request's stream."""

import asyncio
import unittest

from rtp_llm.config.generate_config import GenerateConfig
from rtp_llm.frontend.backend_client import Chunk
from rtp_llm.frontend.generation import Streaming, generate_sequences


class ByteTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


class ScriptedClient:
    """Sends `pieces` (lists of byte ids) as chunks, the last one finished; records each
    request's is_streaming and whether its stream was closed before the end."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.streaming = []
        self.closed_early = 0

    async def generate(self, token_ids, config, request_id=0):
        self.streaming.append(config.is_streaming)
        done = False
        try:
            for i, piece in enumerate(self.pieces):
                done = i == len(self.pieces) - 1
                yield Chunk(list(piece), done, {"output_len": i + 1}, None, "length" if done else None)
                await asyncio.sleep(0)
        finally:
            self.closed_early += not done


async def events(client, pacing=Streaming(), stop=(), n=1):
    config = GenerateConfig(max_new_tokens=100, num_return_sequences=n)
    return [ev async for ev in generate_sequences(client, ByteTokenizer(), [1, 2], config, stop, pacing=pacing)]


def byte_pieces(text, size=1):
    data = text.encode()
    return [list(data[i:i + size]) for i in range(0, len(data), size)]


class GenerationTest(unittest.IsolatedAsyncioTestCase):
    async def test_tokens_that_arrive_together_are_one_event(self):
        evs = await events(ScriptedClient([list(b"abc"), list(b"de"), list(b"f")]))
        self.assertEqual([ev.delta for ev in evs], ["abc", "de", "f"])
        self.assertEqual([ev.finished for ev in evs], [False, False, True])
        self.assertEqual(evs[-1].num_tokens, 6)

    async def test_tokens_whose_text_is_held_still_make_an_event(self):
        # "é" is two bytes: its first arrives alone and has no text yet; so does a stop string's
        # first character. Each such token is an event of its own, with empty text.
        evs = await events(ScriptedClient([list(b"a"), [0xC3], [0xA9], list(b"S"), list(b"x"), list(b"b")]),
                           stop=["ST"])
        self.assertEqual([ev.delta for ev in evs], ["a", "", "\u00e9", "", "Sx", "b"])
        self.assertEqual([ev.token_ids for ev in evs], [[97], [0xC3], [0xA9], [83], [120], [98]])

    async def test_the_stream_interval_paces_events_but_never_the_first_or_last(self):
        evs = await events(ScriptedClient(byte_pieces("0123456789")), Streaming(True, 4))
        self.assertEqual([ev.delta for ev in evs], ["0", "1234", "5678", "9"])
        self.assertTrue(evs[-1].finished)

    async def test_a_request_not_streamed_is_one_event_from_one_engine_message(self):
        client = ScriptedClient(byte_pieces("hello"))
        evs = await events(client, Streaming(stream=False))
        self.assertEqual([(ev.delta, ev.finished) for ev in evs], [("hello", True)])
        self.assertEqual(client.streaming, [False])
        client = ScriptedClient(byte_pieces("hello"))
        await events(client, Streaming(stream=False), stop=["ll"])
        self.assertEqual(client.streaming, [True])  # a stop string needs every token

    async def test_a_stop_string_ends_the_text_and_closes_the_stream(self):
        client = ScriptedClient(byte_pieces("one STOP two"))
        evs = await events(client, stop=["STOP"])
        self.assertEqual("".join(ev.delta for ev in evs), "one ")
        self.assertEqual((evs[-1].finished, evs[-1].finish_reason), (True, "stop"))
        self.assertEqual(client.closed_early, 1)

    async def test_n_sequences_interleave_and_each_finishes(self):
        client = ScriptedClient(byte_pieces("abc"))
        evs = await events(client, n=3)
        for i in range(3):
            mine = [ev for ev in evs if ev.index == i]
            self.assertEqual("".join(ev.delta for ev in mine), "abc")
            self.assertTrue(mine[-1].finished)
        self.assertEqual(client.closed_early, 0)


if __name__ == "__main__":
    unittest.main()
