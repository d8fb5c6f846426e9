"""The grammar mask fill on the core's native thread (native_fill.py) through the real engine,
overlapped, on a tiny random model with a tiny byte-level tokenizer (testlib): it is the fill
the engine uses where xgrammar binds with tvm-ffi, its masks equal xgrammar's Python call's, it
opens a device gate's counter itself, a failed native fill fails its step (the gate still
opened) and the engine serves on, and a native fill that differs from xgrammar's is dropped for
the Python thread at its first use."""

import json
import tempfile
import time
import unittest

import torch

from rtp_llm.async_decoder_engine import mask_filler
from rtp_llm.async_decoder_engine.native_fill import NativeMatcherJob
from rtp_llm.device.base import HostGate
from rtp_llm.llm import LLM
from rtp_llm.test import testlib
from rtp_llm.test.grammar_schema import SCHEMA, valid


class CounterGate(HostGate):
    """A HostGate whose open() is a store to a 64-bit counter, as CUDA's: wait() (the engine
    thread here, the device there) polls it until its ticket is reached (at most 30 s)."""

    def __init__(self):
        self.counter = torch.zeros(1, dtype=torch.int64)
        self.waited, self._last = [], 0

    def next(self) -> int:
        self._last += 1
        return self._last

    def wait(self, ticket: int) -> None:
        self.waited.append(ticket)
        for _ in range(30000):
            if int(self.counter[0]) >= ticket:
                return
            time.sleep(0.001)
        raise AssertionError(f"gate ticket {ticket} was never opened")

    def open(self, ticket: int) -> None:
        raise AssertionError("a native fill opens the gate by its counter, never by open()")

    def counter_address(self) -> int:
        return self.counter.data_ptr()


class NativeFillTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = testlib.add_tiny_tokenizer(testlib.make_tiny("qwen3_gqa_untied", cls.tmp.name))
        mask_filler.BATCH_MIN_ROWS = 2  # (these few streams fill as one batch)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.llm = LLM(self.path, progress=False, overlap_schedule=True, max_batch_size=8, num_kv_blocks=256)
        self.filler = self.llm.engine.grammar._filler

    def tearDown(self):
        self.llm.close()

    def sample_json(self, n=3):
        configs = [{"max_new_tokens": 120, "temperature": 1.0, "random_seed": s, "json_schema": SCHEMA}
                   for s in range(n)]
        return [o.outputs[0] for o in self.llm.generate(["a b c"] * n, configs)]

    def test_the_overlapped_engine_fills_natively_and_its_masks_equal_xgrammars(self):
        checked = []
        check = self.filler._check_native

        def counted(*args):
            check(*args)
            checked.append(self.filler._native_checked)
        self.filler._check_native = counted
        fills, accepts, submit = [], [], NativeMatcherJob.submit

        def spied(native, matchers, tokens, live, host, rows, gate, ticket, after=None):
            wait = submit(native, matchers, tokens, live, host, rows, gate, ticket, after)

            def checked_wait():  # each native mask against xgrammar's Python call on the same matchers
                rejected = wait()
                expected = host.clone()
                self.filler._fill(live, expected, rows)
                fills.append(torch.equal(host, expected) and len(rejected) == 0)
                accepts.append(len(matchers))
                return rejected
            return checked_wait
        NativeMatcherJob.submit = spied
        try:
            for out in self.sample_json():
                self.assertEqual(out.finish_reason, "stop")
                self.assertTrue(valid(json.loads(out.text)), out.text)
        finally:
            NativeMatcherJob.submit = submit
        self.assertEqual(checked, [True])  # checked once, at the first batch fill
        self.assertGreater(len(fills), 10)
        self.assertTrue(all(fills))
        self.assertGreater(min(accepts[1:]), 0)  # the matchers accepted their tokens on the native thread

    def test_the_native_thread_opens_the_gate_by_its_counter(self):
        gate = self.filler._gate = CounterGate()
        for out in self.sample_json():
            self.assertTrue(valid(json.loads(out.text)), out.text)
        self.assertGreater(len(gate.waited), 5)
        self.assertEqual(int(gate.counter[0]), gate.waited[-1])

    def test_a_failed_native_fill_fails_its_step_opens_the_gate_and_the_engine_serves_on(self):
        self.sample_json(2)  # (the first fill's check passed)
        submit = NativeMatcherJob.submit

        def out_of_range(native, matchers, tokens, live, host, rows, gate_, ticket, after=None):  # rows past the mask
            return submit(native, matchers, tokens, live, host, [host.shape[0] + 5] * len(rows), gate_, ticket, after)
        NativeMatcherJob.submit = out_of_range
        try:
            for out in self.sample_json():  # no gate: the sampling waits for the fill on the host
                self.assertIn("batch mask fill failed on the native thread", out.finish_reason)
            gate = self.filler._gate = CounterGate()
            for out in self.sample_json():  # gated: the sampling ran behind the gate, the step fails
                self.assertIn("(606)", out.finish_reason)
        finally:
            NativeMatcherJob.submit = submit
        self.assertEqual(int(gate.counter[0]), gate.waited[-1])
        for out in self.sample_json():
            self.assertTrue(valid(json.loads(out.text)), out.text)

    def test_a_native_fill_that_differs_from_xgrammars_is_dropped_for_the_python_thread(self):
        submit = NativeMatcherJob.submit

        def wrong(native, matchers, tokens, live, host, rows, gate, ticket, after=None):  # a row allowing nothing
            wait = submit(native, matchers, tokens, live, host, rows, gate, ticket, after)

            def wait_and_spoil():
                rejected = wait()
                host[rows[0]].zero_()
                return rejected
            return wait_and_spoil
        NativeMatcherJob.submit = wrong
        try:
            with self.assertLogs("rtp_llm.async_decoder_engine.mask_filler", "ERROR") as logs:
                outs = self.sample_json()
        finally:
            NativeMatcherJob.submit = submit
        self.assertIn("its mask differs from xgrammar's Python call", logs.output[0])
        self.assertIsNone(self.filler._native)
        for out in outs:
            self.assertEqual(out.finish_reason, "stop")
            self.assertTrue(valid(json.loads(out.text)), out.text)


if __name__ == "__main__":
    unittest.main()
