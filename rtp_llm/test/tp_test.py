"""Tensor parallelism on the CPU (gloo, two processes): TP=2 gives the same greedy tokens as
TP=1 with split KV heads (GQA), a replicated KV head (MQA), tied and untied vocab-parallel
embeddings, chunked prefill and preemption; a dead rank makes rank 0 fail with an error
instead of hanging."""

import tempfile
import time
import unittest

import torch

from rtp_llm.distributed.tensor_parallel import CollectiveError
from rtp_llm.llm import LLM
from rtp_llm.test.testlib import make_tiny
from rtp_llm.test.testlib import random_prompts as prompts

CONFIG = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


def tokens(path, tp_size, batch, **engine_args):
    llm = LLM(path, act_type="fp32", progress=False, max_seq_len=128, tp_size=tp_size, **engine_args)
    try:
        return [o.outputs[0].token_ids for o in llm.generate(batch, CONFIG)]
    finally:
        llm.close()


class TensorParallelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_tp2_equals_tp1(self):
        cases = [("qwen3_gqa_untied", {}),                                  # 2 KV heads: one per rank
                 ("qwen2_mqa_tied", {"max_num_batched_tokens": 16}),        # 1 KV head, replicated; chunks
                 ("llama_mha_untied", {"num_kv_blocks": 12, "warm_up": False})]  # preemption
        for name, engine_args in cases:
            with self.subTest(name):
                path = make_tiny(name, self.tmp.name)
                batch = prompts(1, [3, 17, 40, 9, 33])
                self.assertEqual(tokens(path, 2, batch, **engine_args), tokens(path, 1, batch, **engine_args))

    def test_tp2_with_overlapped_steps_equals_tp1(self):
        # Steps scheduled ahead of the tokens they run on: rank 0 broadcasts its sampled tokens.
        path = make_tiny("qwen3_gqa_untied", self.tmp.name)
        batch = prompts(3, [3, 17, 40, 9, 33])
        self.assertEqual(tokens(path, 2, batch, overlap_schedule=True, max_num_batched_tokens=16),
                         tokens(path, 1, batch))

    def test_a_dead_rank_fails_the_step_instead_of_hanging(self):
        path = make_tiny("qwen3_gqa_untied", self.tmp.name)
        # A collective to a killed peer usually errors at once; when it waits instead (the kill
        # not yet seen), --dist_timeout_s bounds it: 20 s, not the 120 s default, fits the bar.
        llm = LLM(path, act_type="fp32", progress=False, max_seq_len=128, tp_size=2, dist_timeout_s=20)
        try:
            llm._workers[0].kill()
            llm._workers[0].join()
            start = time.time()
            with self.assertRaises(CollectiveError):
                llm.generate(prompts(2, [5]), CONFIG)
            self.assertLess(time.time() - start, 60)
        finally:
            llm.engine.broadcast = None  # nobody left to tell to stop
            llm._workers = []
            llm.engine.close()
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    unittest.main()
