"""A model-runner failure fails only the requests of its step; the engine serves on."""

import os
import tempfile
import unittest

POISON = 499

os.environ["RTP_LLM_TEST_FAIL_ON_TOKEN"] = str(POISON)  # test-only hook, read by the ModelRunner

from rtp_llm.llm import LLM  # noqa: E402
from rtp_llm.test.testlib import make_tiny  # noqa: E402


class FaultTest(unittest.TestCase):
    def test_injected_failure_fails_only_its_requests(self):
        # Overlapped: the failing step is launched while the one before is in flight, which
        # still commits.
        for overlap in (False, True):
            with self.subTest(overlap=overlap), tempfile.TemporaryDirectory() as tmp:
                llm = LLM(make_tiny("llama_gqa_tied", tmp), act_type="fp32", progress=False, max_seq_len=128,
                          max_batch_size=1, warm_up=False,  # batch of one: each request is its own step
                          overlap_schedule=overlap)
                try:
                    config = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
                    good, bad, after = llm.generate([[1, 2, 3], [4, POISON, 6], [7, 8, 9]], config)
                    self.assertEqual(len(good.outputs[0].token_ids), 8)
                    self.assertEqual(len(after.outputs[0].token_ids), 8)
                    self.assertTrue(bad.outputs[0].finish_reason.startswith("error: model execution failed"),
                                    bad.outputs[0].finish_reason)
                    self.assertIn("(606)", bad.outputs[0].finish_reason)
                    stats = llm.engine.core.stats()
                    self.assertEqual(stats["used_blocks"], 0)
                    self.assertEqual(stats["running"] + stats["waiting"], 0)
                finally:
                    llm.close()


if __name__ == "__main__":
    unittest.main()
