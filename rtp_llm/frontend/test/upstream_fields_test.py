"""Upstream RTP-LLM's generate_config keys on the native API: every one is ours, a frontend
option, ignored or refused (config/upstream_generate_fields.py); the ignored are accepted, the
refused are a 400 naming them unless they ask for nothing, and the translated ones become the
engine fields they amount to."""

import unittest
from dataclasses import fields

from rtp_llm.config.generate_config import GenerateConfig
from rtp_llm.config.upstream_generate_fields import IGNORED, REFUSED, UPSTREAM_KEYS
from rtp_llm.frontend.errors import RequestError
from rtp_llm.frontend.request import NATIVE_OPTIONS, native_config


def native(**generate_config):
    return native_config({"prompt": "x", "generate_config": generate_config})


class UpstreamFieldsTest(unittest.TestCase):
    def assert_refused(self, field, **generate_config):
        with self.assertRaises(RequestError) as cm:
            native(**generate_config)
        self.assertEqual(cm.exception.field, f"generate_config.{field}")

    def test_every_upstream_key_has_exactly_one_place(self):
        places = [{f.name for f in fields(GenerateConfig)}, set(NATIVE_OPTIONS), set(IGNORED), set(REFUSED)]
        for key in UPSTREAM_KEYS:
            with self.subTest(key):
                self.assertEqual(sum(key in p for p in places), 1)
        self.assertEqual(len(set(UPSTREAM_KEYS)), len(UPSTREAM_KEYS))

    def test_ignored_keys_are_accepted(self):
        config, _ = native(**dict({k: "anything" for k in IGNORED}, trace_id="t-1", role_addrs=[{"role": "PREFILL"}]))
        self.assertEqual(config, GenerateConfig())

    def test_refused_keys_pass_at_their_default_and_are_a_400_otherwise(self):
        native(num_beams=1, variable_num_beams=[], return_logits=False, select_tokens_id=[], top_p_decay=None,
               adapter_name=None, ttft_timeout_ms=-1, calculate_loss=0)
        for field, value in [("num_beams", 2), ("variable_num_beams", [1, 4]), ("return_logits", True),
                             ("select_tokens_id", [3]), ("top_p_decay", 0.9), ("adapter_name", "lora1"),
                             ("ttft_timeout_ms", 100), ("return_hidden_states", True), ("num_beams", "2")]:
            with self.subTest(field):
                self.assert_refused(field, **{field: value})

    def test_upstream_unset_values_mean_unset(self):
        config, _ = native(timeout_ms=-1, num_return_sequences=0)
        self.assertEqual((config.timeout_ms, config.num_return_sequences), (0, 1))

    def test_translations(self):
        config, options = native(do_sample=False, temperature=0.8, eos_token_id=[5, 6], stop_words_list=[[9]],
                                 bad_words_list=[[7], [8]], logit_bias={"7": 3})
        self.assertEqual(config.temperature, 0.0)
        self.assertEqual(config.stop_words_list, [[9], [5], [6]])
        self.assertEqual(config.logit_bias, {7: -100.0, 8: -100.0})
        self.assertEqual(native(eos_token_id=4)[0].stop_words_list, [[4]])
        self.assertEqual(native(bad_words_list=[[[3]]])[0].logit_bias, {3: -100.0})  # upstream's batch form
        self.assertEqual(native(do_sample=True, temperature=0.8)[0].temperature, 0.8)
        self.assert_refused("bad_words_list", bad_words_list=[[7, 8]])
        self.assert_refused("bad_words_list", bad_words_list=[3])
        for junk in ([[[1]], 5], [[[1, 2]]], [[[1]], [[2]], [3]], [["a"]], [[True]], [[]], {"a": 1}):
            with self.subTest(junk=junk):
                self.assert_refused("bad_words_list", bad_words_list=junk)
        self.assert_refused("eos_token_id", eos_token_id="2")
        self.assert_refused("skip_special_tokens", skip_special_tokens="no")

    def test_a_key_in_no_list_is_still_unknown(self):
        self.assert_refused("num_beamz", num_beamz=1)

    def test_thinking_fields_reach_the_proto(self):
        config, _ = native(max_thinking_tokens=12, in_think_mode=True, end_think_token_ids=[5, 6],
                           no_repeat_ngram_size=3)
        p = config.to_proto()
        self.assertEqual((p.max_thinking_tokens, p.in_think_mode, list(p.end_think_token_ids)), (12, True, [5, 6]))
        self.assertEqual(p.no_repeat_ngram_size.value, 3)
        self.assertFalse(GenerateConfig().to_proto().HasField("no_repeat_ngram_size"))
        self.assert_refused("end_think_token_ids", end_think_token_ids=[-1])


if __name__ == "__main__":
    unittest.main()
