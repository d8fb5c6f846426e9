"""Parity with HF transformers on tiny random checkpoints: 64 greedy tokens equal HF's for a
batch of mixed-length prompts, also with chunked prefill, a shared prefix served by the
prefix cache, and preemption; prefill logits agree within 1e-4 (fp32), and so do prompt
log-probs and their alternatives (HF's log-softmax) through chunks, overlap and preemption."""

import tempfile
import unittest

import torch

from rtp_llm.llm import LLM
from rtp_llm.test.testlib import (TINY, assert_prefill_logits_match_hf, hf_greedy, hf_logprobs, hf_model, make_tiny,
                                  overlap_sampling_configs)
from rtp_llm.test.testlib import random_prompts as prompts

NEW_TOKENS = 64
LOGIT_TOL = 1e-4


class ParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.paths = {name: make_tiny(name, cls.tmp.name) for name in TINY}
        cls.hf = {name: hf_model(path) for name, path in cls.paths.items()}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check(self, name, batch, paged_chunk_work=None, **engine_args):
        llm = LLM(self.paths[name], act_type="fp32", progress=False, max_seq_len=256, **engine_args)
        if paged_chunk_work is not None:
            llm.engine.backend.paged_chunk_work = paged_chunk_work
        try:
            config = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
            ours = llm.generate(batch, config)
            for prompt, out in zip(batch, ours):
                self.assertEqual(out.outputs[0].token_ids, hf_greedy(self.hf[name], prompt, NEW_TOKENS),
                                 f"{name}, prompt of {len(prompt)} tokens, {engine_args}")
            return llm.engine.core.stats(), ours
        finally:
            llm.close()

    def test_mixed_length_batch(self):
        for name in TINY:
            with self.subTest(name):
                self.check(name, prompts(1, [3, 17, 40, 9, 64]))

    def test_chunked_prefill(self):
        for name in TINY:
            with self.subTest(name):
                self.check(name, prompts(2, [50, 33, 7]), max_num_batched_tokens=16)

    def test_prompt_chunks_on_the_paged_kernel(self):
        # Prompt chunks of up to paged_chunk_work (query x context) pairs run on the paged
        # kernel (by default bf16 on CPUs with AVX512-BF16 only; the other tests here run every
        # fp32 prompt on SDPA): steps with both kinds (3 x 3 and 17 x 17 paged, 40 x 40 on
        # SDPA; chunked prefill: 16 x 16 paged, chunks after a prefix on SDPA), then every
        # prompt on the paged kernel.
        for name in TINY:
            with self.subTest(name):
                for work in (300, 1 << 20):
                    self.check(name, prompts(1, [3, 17, 40, 9]), paged_chunk_work=work)
                    self.check(name, prompts(2, [50, 33, 7]), paged_chunk_work=work, max_num_batched_tokens=16)

    def test_shared_prefix_hits_the_prefix_cache(self):
        for name in TINY:
            with self.subTest(name):
                shared = prompts(3, [48])[0]
                batch = prompts(4, [5, 11, 20], prefix=shared)
                llm = LLM(self.paths[name], act_type="fp32", progress=False, max_seq_len=256)
                try:
                    config = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
                    first = llm.generate(batch[0], config)[0]  # fills the cache with the shared prefix
                    rest = llm.generate(batch[1:], config)
                    for prompt, out in zip(batch, [first] + rest):
                        self.assertEqual(out.outputs[0].token_ids, hf_greedy(self.hf[name], prompt, NEW_TOKENS))
                    self.assertTrue(all(o.aux_info["reuse_len"] >= 48 for o in rest), [o.aux_info for o in rest])
                finally:
                    llm.close()

    def test_preemption(self):
        for name in TINY:
            with self.subTest(name):
                # 5 streams growing to ~100 tokens (7 blocks each) in 24 blocks: some must yield.
                stats, _ = self.check(name, prompts(5, [30, 36, 25, 40, 31]), num_kv_blocks=24, warm_up=False)
                self.assertGreater(stats["preemptions"], 0)
                self.assertEqual(stats["used_blocks"], 0)

    def test_overlapped_steps(self):
        # Each step scheduled and launched ahead of the previous one's tokens (CUDA's default),
        # here on the CPU: the same tokens, through chunks and preemption.
        for name in TINY:
            with self.subTest(name):
                self.check(name, prompts(2, [50, 33, 7, 64]), max_num_batched_tokens=16, overlap_schedule=True)
                stats, _ = self.check(name, prompts(5, [30, 36, 25, 40, 31]), num_kv_blocks=24, warm_up=False,
                                      overlap_schedule=True)
                self.assertGreater(stats["preemptions"], 0)
                self.assertEqual(stats["used_blocks"], 0)

    def test_overlapped_sampling_is_the_same(self):
        # Overlap on and off generate the same.
        name = next(iter(TINY))
        batch = prompts(7, [12, 30, 5])
        configs = overlap_sampling_configs(batch[2][-1])
        outs = []
        for overlap in (False, True):
            llm = LLM(self.paths[name], act_type="fp32", progress=False, max_seq_len=256, overlap_schedule=overlap)
            try:
                self.assertEqual(llm.engine.overlap, overlap)
                outs.append([o.outputs[0].token_ids for o in llm.generate(batch, configs)]
                            + [o.outputs[0].token_ids for o in llm.generate(batch, configs[0])])
            finally:
                llm.close()
        self.assertEqual(outs[0], outs[1])

    def test_prefill_logits_match(self):
        for name in TINY:
            with self.subTest(name):
                assert_prefill_logits_match_hf(self.paths[name], self.hf[name], prompts(6, [37])[0], LOGIT_TOL)


    def test_prompt_logprobs_match_hf(self):
        from rtp_llm.config.generate_config import GenerateConfig
        from rtp_llm.ops.engine_core import decode_output

        name = next(iter(TINY))
        batch = prompts(8, [40, 23, 5, 1])
        new = 20  # the streams grow past the 5-block cache of the last case together: preemption
        plp = GenerateConfig(max_new_tokens=new, temperature=0, ignore_eos=True, prompt_logprobs=3).to_proto()
        plain = GenerateConfig(max_new_tokens=new, temperature=0, ignore_eos=True).to_proto()
        for args in ({}, {"max_num_batched_tokens": 16}, {"max_num_batched_tokens": 16, "overlap_schedule": True},
                     {"num_kv_blocks": 5, "max_seq_len": 64, "warm_up": False, "max_num_batched_tokens": 16}):
            with self.subTest(**args):
                llm = LLM(self.paths[name], act_type="fp32", progress=False, **{"max_seq_len": 256, **args})
                core = llm.engine.core
                try:
                    first = core.enqueue(batch[0], plain)  # its blocks cached: never hit by what follows
                    while llm.engine.step():
                        pass
                    core.release(first)
                    ids = [core.enqueue(p, plp) for p in batch]
                    while llm.engine.step():
                        pass
                    for prompt, sid in zip(batch, ids):
                        out = decode_output(core.poll(sid)[0])
                        core.release(sid)
                        self.assertEqual(len(out.token_ids), new)
                        if len(prompt) == 1:  # nothing precedes its one token
                            self.assertIsNone(out.prompt_logprobs)
                            continue
                        ref = hf_logprobs(self.hf[name], prompt)[:-1]  # row q - 1: token q's distribution
                        want = ref.gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1)
                        torch.testing.assert_close(torch.tensor(out.prompt_logprobs), want, atol=LOGIT_TOL,
                                                   rtol=LOGIT_TOL)
                        top = ref.topk(3, dim=-1)
                        self.assertEqual([[t for t, _ in row] for row in out.prompt_top_logprobs],
                                         top.indices.tolist())
                        torch.testing.assert_close(torch.tensor([[v for _, v in row] for row in out.prompt_top_logprobs]),
                                                   top.values, atol=LOGIT_TOL, rtol=LOGIT_TOL)
                    if "num_kv_blocks" in args:
                        self.assertGreater(core.stats()["preemptions"], 0)
                finally:
                    llm.close()


if __name__ == "__main__":
    unittest.main()
