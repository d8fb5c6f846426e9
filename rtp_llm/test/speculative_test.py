"""Speculative decoding by prompt lookup (--sp_type=ngram) on the tiny fixture models: greedy
tokens (and log-probs) are those of the plain engine, with chunked prefill, the prefix cache,
stop words and overlap; drafts really get accepted (fewer engine steps: iter_count); rows
sampled at temperature > 0 draft too (rejection sampling: their distribution is
rejection_sampler_test's), seeded ones the same text run to run; so do penalized and biased
rows, with the plain greedy text; rows that may not draft (force_disable_sp_run, a thinking
budget) do not.

The tiny fixtures' random weights seldom repeat themselves, so drafts are seldom right there
(their text is still compared); "loopy" is qwen3_gqa_untied with its attention outputs scaled
down (o_proj x 0.05): its greedy text falls into short loops and escapes them (attention still
matters), so drafts are accepted and rejected both. "sharp" is loopy with its logits scaled up
(lm_head x 4), so that sampling at temperature > 0 loops as well."""

import json
import os
import tempfile
import unittest

from rtp_llm.config.speculative import SpeculativeConfig
from rtp_llm.llm import LLM
from rtp_llm.test.testlib import TINY, make_loopy, make_tiny, repetitive_prompts

NEW_TOKENS = 64
NGRAM = SpeculativeConfig("ngram", 4, 1, 3)


class SpeculativeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.paths = {name: make_tiny(name, cls.tmp.name) for name in TINY}
        cls.paths["loopy"] = make_loopy(cls.tmp.name)
        cls.paths["sharp"] = make_loopy(cls.tmp.name, "sharp", logit_scale=4.0)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_engine(self, name, batches, config, spec=None, **engine_args):
        """Outputs of each batch in turn (one engine: a later batch may hit the prefix cache),
        and the core's stats."""
        llm = LLM(self.paths[name], act_type="fp32", progress=False, max_seq_len=256,
                  speculative=NGRAM if spec is None else spec, **engine_args)
        try:
            return [llm.generate(b, config) for b in batches], llm.engine.core.stats()
        finally:
            llm.close()

    def compare(self, name, batches, config, **engine_args):
        plain, _ = self.run_engine(name, batches, config, SpeculativeConfig(), **engine_args)
        spec, stats = self.run_engine(name, batches, config, **engine_args)
        steps = [0, 0]
        for outs_plain, outs_spec in zip(plain, spec):
            for a, b in zip(outs_plain, outs_spec):
                self.assertEqual(b.outputs[0].token_ids, a.outputs[0].token_ids, f"{name} {engine_args}")
                self.assertEqual(b.outputs[0].finish_reason, a.outputs[0].finish_reason)
                steps[0] += a.aux_info["iter_count"]
                steps[1] += b.aux_info["iter_count"]
                self.assertEqual(a.aux_info["speculative_draft_rounds"], 0)
        return plain, spec, stats, steps

    def test_greedy_tokens_equal_the_plain_engine_in_fewer_steps(self):
        config = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True, "return_logprobs": True}
        for name in list(TINY) + ["loopy"]:
            with self.subTest(name):
                plain, spec, stats, steps = self.compare(name, [repetitive_prompts()], config)
                for a, b in zip(plain[0], spec[0]):  # each accepted token's log-prob is the plain step's
                    for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
                        self.assertAlmostEqual(x, y, delta=1e-3)
                rounds = sum(o.aux_info["speculative_draft_rounds"] for o in spec[0])
                accepted = sum(sum(o.aux_info["speculative_accepted_tokens_per_pos"]) for o in spec[0])
                self.assertEqual((rounds, accepted), (stats["spec_draft_rounds"], stats["spec_accepted_tokens"]))
                if name == "loopy":
                    self.assertGreater(stats["spec_accepted_tokens"], 0, stats)
                    self.assertLess(stats["spec_accepted_tokens"], stats["spec_draft_tokens"], stats)
                    self.assertLess(steps[1], steps[0], f"iter_count with / without: {steps}")

    def test_chunked_prefill_prefix_cache_and_stop_words(self):
        name = "loopy"
        prompts = repetitive_prompts()
        config = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
        plain, _ = self.run_engine(name, [prompts[:1]], config, SpeculativeConfig())
        # A stop word of 2 tokens taken from the middle of the plain output: it ends inside a run.
        out = plain[0][0].outputs[0].token_ids
        stop = {**config, "stop_words_list": [out[20:22]]}
        # The second batch repeats the first's prompts: their full blocks come from the prefix cache.
        _, spec, stats, _ = self.compare(name, [prompts, prompts], stop, max_num_batched_tokens=16)
        reused = [o.aux_info["reuse_len"] > 0 for p, o in zip(prompts, spec[1]) if len(p) > 16]  # a full block
        self.assertTrue(reused and all(reused), [o.aux_info for o in spec[1]])
        self.assertGreater(stats["spec_accepted_tokens"], 0)
        self.assertEqual(stats["used_blocks"], 0)

    def test_overlapped_scheduling(self):
        config = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
        _, _, stats, steps = self.compare("loopy", [repetitive_prompts()], config, overlap_schedule=True)
        self.assertGreater(stats["spec_accepted_tokens"], 0)

    def test_sampled_rows_draft_and_repeat_their_seeded_text(self):
        config = {"max_new_tokens": NEW_TOKENS, "temperature": 0.8, "top_p": 0.9, "random_seed": 5, "ignore_eos": True}
        prompts = repetitive_prompts()
        plain, _ = self.run_engine("sharp", [prompts], config, SpeculativeConfig())
        spec, stats = self.run_engine("sharp", [prompts], config)
        again, _ = self.run_engine("sharp", [prompts], config)
        with open(os.path.join(self.paths["sharp"], "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        for a, b in zip(spec[0], again[0]):
            self.assertEqual(a.outputs[0].token_ids, b.outputs[0].token_ids)  # seeded: run to run
            self.assertEqual(len(a.outputs[0].token_ids), NEW_TOKENS)
            self.assertEqual(a.outputs[0].finish_reason, "length")
            self.assertTrue(all(0 <= t < vocab for t in a.outputs[0].token_ids))
        rounds = sum(o.aux_info["speculative_draft_rounds"] for o in spec[0])
        accepted = sum(sum(o.aux_info["speculative_accepted_tokens_per_pos"]) for o in spec[0])
        self.assertEqual((rounds, accepted), (stats["spec_draft_rounds"], stats["spec_accepted_tokens"]))
        self.assertGreater(stats["spec_accepted_tokens"], 0, stats)
        self.assertLess(stats["spec_accepted_tokens"], stats["spec_draft_tokens"], stats)
        steps = [sum(o.aux_info["iter_count"] for o in outs[0]) for outs in (plain, spec)]
        self.assertLess(steps[1], steps[0], f"iter_count without / with: {steps}")

    def test_penalized_and_biased_rows_draft_with_the_plain_greedy_text(self):
        """Each verify row's penalties count the drafts before it as generated tokens, so the
        text is the plain engine's token for token (compare()); and drafts do get accepted."""
        prompts = repetitive_prompts()
        base = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
        plain, _ = self.run_engine("loopy", [prompts[:1]], base, SpeculativeConfig())
        out = plain[0][0].outputs[0].token_ids
        for extra in ({"repetition_penalty": 1.05}, {"presence_penalty": 0.2, "frequency_penalty": 0.1},
                      {"no_repeat_ngram_size": 6}, {"logit_bias": {out[3]: 0.5, out[9]: -0.5}},
                      {"repetition_penalty": 1.02, "frequency_penalty": 0.05, "logit_bias": {out[5]: 0.3},
                       "stop_words_list": [out[30:32]]}):
            with self.subTest(extra):
                _, _, stats, steps = self.compare("loopy", [prompts], {**base, **extra})
                self.assertGreater(stats["spec_accepted_tokens"], 0, stats)
                self.assertLess(steps[1], steps[0], f"iter_count with / without: {steps}")

    def test_rows_that_may_not_draft_decode_as_before(self):
        prompts = repetitive_prompts()[:2]
        for config in ({"max_new_tokens": 24, "temperature": 0, "ignore_eos": True, "force_disable_sp_run": True},
                       {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True, "in_think_mode": True,
                        "max_thinking_tokens": 8, "end_think_token_ids": [7, 8]}):
            with self.subTest(config):
                _, spec, stats, steps = self.compare("loopy", [prompts], config)
                self.assertEqual(stats["spec_draft_rounds"], 0)
                self.assertEqual(steps[0], steps[1])


if __name__ == "__main__":
    unittest.main()
