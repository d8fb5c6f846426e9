"""Grammar-constrained generation through the real engine on a tiny random model with a tiny
byte-level tokenizer (testlib): sampled output follows the grammar and ends with "stop", each
matcher accepted exactly its stream's committed tokens (overlapped scheduling on and off),
greedy output under a grammar that admits the unconstrained answer is that answer, and a
grammar that does not compile fails only its request, naming the field; with a device gate
(mask_filler.py) every ticket is opened and a failed fill fails its step."""

import json
import re
import tempfile
import threading
import time
import unittest
from concurrent.futures import Future

import torch

from rtp_llm.async_decoder_engine import mask_filler
from rtp_llm.async_decoder_engine.grammar import GrammarBook, GrammarOptions
from rtp_llm.device.base import HostGate
from rtp_llm.ops.engine_core import EngineCore

from rtp_llm.config.generate_config import GenerateConfig
from rtp_llm.config.grammar import literal_regex
from rtp_llm.llm import LLM
from rtp_llm.test import testlib
from rtp_llm.test.grammar_schema import SCHEMA, valid

class BlockingGate(HostGate):
    """A HostGate for a device without streams: wait() blocks the caller until its ticket opens
    (at most 30 s: a ticket never opened fails the test instead of hanging it)."""

    def __init__(self):
        self.waited, self.opened, self._last = [], 0, 0
        self._cv = threading.Condition()

    def next(self) -> int:
        self._last += 1
        return self._last

    def wait(self, ticket: int) -> None:
        self.waited.append(ticket)
        with self._cv:
            if not self._cv.wait_for(lambda: self.opened >= ticket, timeout=30):
                raise AssertionError(f"gate ticket {ticket} was never opened")

    def open(self, ticket: int) -> None:
        with self._cv:
            self.opened = max(self.opened, ticket)
            self._cv.notify_all()


class GrammarTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = testlib.add_tiny_tokenizer(testlib.make_tiny("qwen3_gqa_untied", cls.tmp.name))
        # Overlapped, masks of several rows are filled on a thread of their own (mask_filler.py;
        # from 2 rows here, so these few streams take that path and one alone does not); in
        # turn, in the engine thread.
        mask_filler.BATCH_MIN_ROWS = 2
        cls.llms = {overlap: LLM(cls.path, progress=False, overlap_schedule=overlap, max_batch_size=8,
                                 num_kv_blocks=256) for overlap in (False, True)}

    @classmethod
    def tearDownClass(cls):
        for llm in cls.llms.values():
            llm.close()
        cls.tmp.cleanup()

    def generate(self, overlap, prompts, configs):
        return self.llms[overlap].generate(prompts, configs)

    def test_sampled_json_follows_the_schema_and_stops(self):
        for overlap in (False, True):
            configs = [{"max_new_tokens": 120, "temperature": 1.0, "random_seed": seed, "json_schema": SCHEMA}
                       for seed in range(6)]
            configs.append({"max_new_tokens": 30, "temperature": 1.0, "random_seed": 9})  # unconstrained alongside
            outs = self.generate(overlap, ["a b c"] * len(configs), configs)
            for o in outs[:-1]:
                seq = o.outputs[0]
                self.assertEqual(seq.finish_reason, "stop", (overlap, seq.text))
                self.assertTrue(valid(json.loads(seq.text)), (overlap, seq.text))
                self.assertEqual(seq.token_ids[-1], 0)  # the EOS closed it
            self.assertEqual(outs[-1].outputs[0].finish_reason, "length")
            stats = self.llms[overlap].engine.core.stats()
            self.assertGreaterEqual(stats["grammar_cache_hits"], 5)  # one schema, six streams
            self.assertGreaterEqual(stats["grammar_compiles"], 1)
            self.assertGreater(stats["grammar_compile_us"], 0)

    def test_each_matcher_accepts_exactly_its_committed_tokens(self):
        # Stop words end some streams with a token to spare in the step scheduled ahead (whose
        # row is dropped at commit): no matcher may see that token.
        for overlap in (False, True):
            llm = self.llms[overlap]
            core, book = llm.engine.core, llm.engine.grammar
            ids = []
            for seed in range(4):
                cfg = {"max_new_tokens": 60, "temperature": 1.0, "random_seed": seed, "json_schema": SCHEMA}
                if seed % 2:
                    cfg["stop_words_list"] = [llm.tokenizer.encode('"')]
                ids.append(core.enqueue(llm.encode("x y"), GenerateConfig.from_dict(cfg).to_proto()))
            accepted = {}
            while llm.engine.step():
                for sid in ids:  # before poll() forgets a stream that ended
                    if book.accepted(sid) >= 0:
                        accepted[sid] = book.accepted(sid)
            for sid in ids:
                tokens, prompt_len = core.stream_tokens(sid)
                self.assertEqual(accepted[sid], len(tokens) - prompt_len, (overlap, sid))
                core.release(sid)

    def test_past_its_grammar_a_stream_samples_only_stop_tokens(self):
        # ignore_eos keeps the stream going after its grammar completed and the EOS was
        # accepted (the matcher terminated): every later token is a stop token.
        for overlap in (False, True):
            out = self.generate(overlap, ["q"], {"max_new_tokens": 7, "temperature": 1.0, "random_seed": 5,
                                                 "regex": "ab", "ignore_eos": True})
            ids = out[0].outputs[0].token_ids
            self.assertEqual(self.llms[overlap].tokenizer.decode(ids[:2]), "ab", overlap)
            self.assertEqual(ids[2:], [0] * 5, overlap)

    def test_overlap_stages_the_next_step_before_a_grammar_step_samples(self):
        # The device must go from a grammar step's sampling straight to the next forward: the
        # next step is scheduled and staged before the mask is filled, and its forward is queued
        # right after the sampling, with no host work between (engine.py's second diagram).
        llm = self.llms[True]
        runner, calls = llm.engine.runner, []
        for name in ("stage", "forward", "sample"):
            def logged(*args, _name=name, _call=getattr(runner, name)):
                calls.append(_name)
                return _call(*args)
            setattr(runner, name, logged)
        try:
            out = self.generate(True, ["a b"], {"max_new_tokens": 12, "temperature": 1.0, "random_seed": 4,
                                                "regex": "[a-z]{40}", "ignore_eos": True})
        finally:
            for name in ("stage", "forward", "sample"):
                delattr(runner, name)
        self.assertEqual(len(out[0].outputs[0].token_ids), 12)
        turns = "".join(c[1] for c in calls)  # t(s)age, f(o)rward, s(a)mple
        # Prefill, then 11 steps scheduled ahead: each staged before the step before samples.
        self.assertEqual(turns.count("tao"), 11, calls)
        self.assertEqual(turns.count("a"), 12, calls)

    def test_with_a_device_gate_the_sampling_waits_there_and_a_failed_fill_fails_its_step(self):
        # The CPU has no stream to hold, so this gate holds the engine thread in wait() until the
        # ticket opens (what was queued behind it runs only then, as on a device): every ticket
        # waited on must be opened, by a fill that succeeds or fails, and a step whose fill failed
        # must fail its requests at commit, not commit tokens sampled under an unfinished mask.
        llm = self.llms[True]
        filler = llm.engine.grammar._filler
        gate = filler._gate = BlockingGate()
        configs = [{"max_new_tokens": 120, "temperature": 1.0, "random_seed": s, "json_schema": SCHEMA}
                   for s in range(3)]
        try:
            for o in self.generate(True, ["a b c"] * 3, configs):
                self.assertTrue(valid(json.loads(o.outputs[0].text)), o.outputs[0].text)
            self.assertGreater(len(gate.waited), 5)
            self.assertEqual(gate.opened, gate.waited[-1])

            def failing(*args):
                raise RuntimeError("xgrammar failed")
            filler._fill = failing
            for o in self.generate(True, ["a b c"] * 3, configs):
                self.assertIn("xgrammar failed", o.outputs[0].finish_reason)
            self.assertEqual(gate.opened, gate.waited[-1])
        finally:
            filler._gate = None
            filler.__dict__.pop("_fill", None)
        self.assertEqual(self.generate(True, ["q"], {"max_new_tokens": 3, "regex": "ab"})[0].outputs[0].text, "ab")

    def test_regex_and_choice_fullmatch(self):
        for overlap in (False, True):
            outs = self.generate(overlap, ["q"] * 4, [
                {"max_new_tokens": 40, "temperature": 1.0, "random_seed": 1, "regex": "[a-z]{2,5}-[0-9]{2}"},
                {"max_new_tokens": 40, "temperature": 1.0, "random_seed": 2, "regex": "(yes|no|maybe)!"},
                {"max_new_tokens": 40, "temperature": 1.0, "random_seed": 3,
                 "ebnf": 'root ::= "[" num ("," num)* "]"\nnum ::= [1-9] [0-9]?'},
                {"max_new_tokens": 40, "temperature": 1.0, "random_seed": 4,
                 "response_format": {"type": "json_object"}}])
            texts = [o.outputs[0].text for o in outs]
            self.assertRegex(texts[0], r"^[a-z]{2,5}-[0-9]{2}$")
            self.assertIn(texts[1], ("yes!", "no!", "maybe!"))
            self.assertRegex(texts[2], r"^\[[1-9][0-9]?(,[1-9][0-9]?)*\]$")
            for o in outs[:3]:
                self.assertEqual(o.outputs[0].finish_reason, "stop", o.outputs[0].text)
            if outs[3].outputs[0].finish_reason == "stop":
                self.assertIsInstance(json.loads(texts[3]), (dict, list))

    def test_greedy_under_a_grammar_that_admits_the_unconstrained_answer_is_that_answer(self):
        # A grammar matching the unconstrained answer's text (or something else): greedy picks the
        # same tokens. Only answers whose tokens are whole ASCII text compare (a random model's
        # stray bytes of a UTF-8 sequence decode to U+FFFD, which no grammar over text matches).
        prompts = testlib.random_prompts(5, [3] * 24)
        compared = 0
        for overlap in (False, True):
            free = self.generate(overlap, prompts, {"max_new_tokens": 6, "temperature": 0})
            for prompt, out in zip(prompts, free):
                seq = out.outputs[0]
                if not seq.text or not seq.text.isascii():
                    continue
                pinned = f"({literal_regex(seq.text)})|zzz"
                got = self.generate(overlap, prompt, {"max_new_tokens": 6, "temperature": 0, "regex": pinned})
                self.assertEqual(got[0].outputs[0].token_ids, seq.token_ids, (overlap, seq.text))
                compared += 1
        self.assertGreater(compared, 2)

    def test_a_grammar_that_does_not_compile_fails_only_its_request(self):
        outs = self.generate(True, ["q", "q"], [{"max_new_tokens": 4, "regex": "[a-"},
                                                {"max_new_tokens": 4, "temperature": 0}])
        self.assertIn("regex does not compile", outs[0].outputs[0].finish_reason)
        self.assertEqual(outs[1].outputs[0].finish_reason, "length")
        stats = self.llms[True].engine.core.stats()
        self.assertGreaterEqual(stats["grammar_failures"], 1)
        self.assertGreaterEqual(stats["grammar_requests"], 1)


class CompileTimeoutTest(unittest.TestCase):
    def test_a_grammar_not_compiled_in_time_fails_only_its_stream_naming_the_field(self):
        core = EngineCore(64, 16, 4, 64, 128)

        class NeverDone:
            options = GrammarOptions(timeout_s=0.05)

            def submit(self, field, spec):
                return Future(), False

        book = GrammarBook(core, NeverDone(), 32, 4, torch.device("cpu"), False, ())
        slow = core.enqueue([1, 2], GenerateConfig.from_dict({"max_new_tokens": 2, "regex": "a+"}).to_proto())
        plain = core.enqueue([1, 2], GenerateConfig.from_dict({"max_new_tokens": 2}).to_proto())
        book.poll()
        self.assertTrue(book.compiling())
        time.sleep(0.1)
        book.poll()
        self.assertFalse(book.compiling())
        out, code = core.poll(slow)
        self.assertEqual(code, 603)  # GENERATE_TIMEOUT
        self.assertEqual(out.error_info.field, "regex")
        self.assertIn("--grammar_admission_compile_timeout_s", out.error_info.error_message)
        self.assertEqual(core.schedule().stream_ids.tolist(), [plain])
        core.close()

    def test_an_engine_without_grammars_refuses_them_naming_the_field(self):
        core = EngineCore(64, 16, 4, 64, 128)
        book = GrammarBook.refusing(core, "this engine does not sample with grammars")
        sid = core.enqueue([1, 2], GenerateConfig.from_dict({"max_new_tokens": 2, "ebnf": 'root ::= "a"'}).to_proto())
        book.poll()
        out, code = core.poll(sid)
        self.assertEqual((code, out.error_info.field), (605, "ebnf"))
        book.poll()
        self.assertEqual(core.take_ended_grammars(), [])  # the book took the ended stream's id
        core.close()


if __name__ == "__main__":
    unittest.main()
