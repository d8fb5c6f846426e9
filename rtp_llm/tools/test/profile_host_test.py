"""profile_host on a tiny random model with a grammar: every phase it names is timed, the grammar
phases only under the schema, a turn is its phases and the gaps between them, a stall is sampled
where it happens, and the run generates the tokens asked for."""

import gc
import tempfile
import time
import unittest

from rtp_llm.async_decoder_engine.grammar import MaskFill
from rtp_llm.async_decoder_engine.host_profile import STALL_FACTOR
from rtp_llm.llm import LLM
from rtp_llm.test import testlib
from rtp_llm.tools import profile_host


class ProfileHostTest(unittest.TestCase):
    def test_phases_are_timed_free_and_under_a_schema(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = testlib.add_tiny_tokenizer(testlib.make_tiny("qwen3_gqa_untied", tmp))
            llm = LLM(path, progress=False, overlap_schedule=True, max_batch_size=4, num_kv_blocks=64)
            try:
                prompts = [[5, 6, 7]] * 3
                schema = {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,4}$"},
                          "minItems": 1000}
                profile_host.run(llm, prompts[:1], 2, schema)  # compiles it
                steps, wall, report = profile_host.run(llm, prompts, 8, None)
                self.assertGreaterEqual(steps, 7)
                free = report["host_ms_per_step"]
                self.assertTrue({"stage", "forward", "sample", "commit", "wait", "core_commit", "schedule",
                                 "turn"} <= set(free), free)
                self.assertFalse({"fill_mask", "mask_wait", "advance"} & set(free))
                self.assertEqual((report["steps"], report["streams"], report["grammar_steps"]), (7, 21, 0))
                self.assertGreater(report["thread"]["cpu_ms_per_step"], 0)  # (Linux: /proc/thread-self)
                steps, wall, report = profile_host.run(llm, prompts, 8, schema)
                constrained = report["host_ms_per_step"]
                self.assertTrue({"fill_mask", "mask_wait", "advance"} <= set(constrained), constrained)
                self.assertEqual(report["grammar_steps"], report["steps"])
                # A turn is its top-level phases and the gaps between them, nothing else.
                top = ("poll", "compiles", "fill_mask", "schedule", "stage", "sample", "forward", "commit")
                accounted = sum(constrained.get(k, 0.0) for k in top) + sum(
                    v for k, v in constrained.items() if k.startswith("before:"))
                self.assertAlmostEqual(accounted, constrained["turn"], delta=0.03)
                self.assertGreaterEqual(report["longest_turn_ms"], constrained["turn"])
                stage, calls = llm.engine.runner.stage, []
                # A stall: far past STALL_FACTOR times any turn so far (this machine's speed).
                stall_s = max(0.2, 3 * STALL_FACTOR * report["longest_turn_ms"] / 1e3)

                def slow_stage(b):  # the third step stalls in its staging
                    calls.append(b)
                    if len(calls) == 3:
                        time.sleep(stall_s)
                    return stage(b)
                llm.engine.runner.stage = slow_stage  # (detach() drops it with the profile's wrapper)
                steps, wall, report = profile_host.run(llm, prompts, 8, None)
                self.assertGreaterEqual(report["longest_turn_ms"], stall_s * 1e3)
                self.assertTrue(report["stalls"] and "slow_stage" in report["stalls"][0][0], report["stalls"])
                self.assertGreater(report["stalls"][0][1], 5)  # samples of ~1 ms (fewer on a loaded machine)
                for obj in (llm.engine.runner, llm.engine.core, llm.engine.grammar, llm.engine):
                    self.assertFalse({"stage", "commit", "schedule_ahead", "advance", "step"} & set(vars(obj)))
                self.assertEqual(MaskFill.result.__qualname__, "MaskFill.result")
                self.assertFalse([c for c in gc.callbacks if "HostProfile" in getattr(c, "__qualname__", "")])
                self.assertEqual(llm.engine.core.stats()["running"], 0)
            finally:
                llm.close()


if __name__ == "__main__":
    unittest.main()
