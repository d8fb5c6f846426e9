"""Request fields: GenerateConfig's defaults, each range's bounds (accepted at the bound,
refused just past it, naming the field as each API calls it), unknown fields, type errors,
and the proto each field becomes."""

import json
import math
import unittest

from rtp_llm.config import grammar as grammars
from rtp_llm.config.grammar import GRAMMAR_FIELDS, GrammarError
from rtp_llm.config.generate_config import GenerateConfig, GenerateConfigError
from rtp_llm.frontend.errors import RequestError
from rtp_llm.frontend.request import native_config, openai_config

I32 = 2 ** 31 - 1
# Written out, not read from the declaration: a changed range must fail here.
RANGES = {  # field: (lo, hi, lo_open)
    "max_new_tokens": (1, I32, False), "min_new_tokens": (0, I32, False), "num_return_sequences": (1, 64, False),
    "temperature": (0, 1e4, False), "top_k": (0, I32, False), "top_p": (0, 1, True), "min_p": (0, 1, False),
    "repetition_penalty": (0.01, 100, False), "presence_penalty": (-2, 2, False), "frequency_penalty": (-2, 2, False),
    "random_seed": (0, 2 ** 63 - 65, False), "timeout_ms": (0, I32, False), "top_logprobs": (0, 20, False),
    "no_repeat_ngram_size": (0, I32, False), "max_thinking_tokens": (0, I32, False), "prompt_logprobs": (0, 20, False),
}
FLOATS = {"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}
DEFAULTS = dict(max_new_tokens=256, min_new_tokens=0, num_return_sequences=1, temperature=1.0, top_k=0, top_p=1.0,
                min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, random_seed=None,
                ignore_eos=False, stop_words_list=[], return_logprobs=False, top_logprobs=0, prompt_logprobs=None,
                logit_bias={}, timeout_ms=0,
                no_repeat_ngram_size=0, max_thinking_tokens=0, in_think_mode=False, end_think_token_ids=[],
                response_format=None, json_schema=None, regex=None, ebnf=None, structural_tag=None,
                force_disable_sp_run=False)
OPENAI = {"max_new_tokens": "max_tokens", "random_seed": "seed", "num_return_sequences": "n"}
NOT_IN_OPENAI = {"min_new_tokens", "timeout_ms", "stop_words_list", "return_logprobs", "top_logprobs",
                 "prompt_logprobs", "in_think_mode",
                 "end_think_token_ids", "force_disable_sp_run"}


def beyond(name, bound, up):
    """The next value past a bound: the next float for float fields, +-1 for integers."""
    if name in FLOATS:
        return math.nextafter(bound, math.inf if up else -math.inf)
    return bound + (1 if up else -1)


class GenerateConfigTest(unittest.TestCase):
    def assert_refused(self, d, field):
        with self.assertRaises(GenerateConfigError) as cm:
            GenerateConfig.from_dict(d)
        self.assertEqual(cm.exception.field, field, d)
        self.assertTrue(str(cm.exception).startswith(f"generate_config.{field}: "), str(cm.exception))

    def test_defaults(self):
        self.assertEqual(vars(GenerateConfig()), DEFAULTS)
        self.assertEqual(GenerateConfig.from_dict({}), GenerateConfig())
        self.assertEqual(GenerateConfig.from_dict(None), GenerateConfig())

    def test_each_range_accepts_its_bounds_and_refuses_past_them(self):
        for name, (lo, hi, lo_open) in RANGES.items():
            with self.subTest(name):
                self.assertEqual(getattr(GenerateConfig.from_dict({name: hi}), name), hi)
                self.assert_refused({name: beyond(name, hi, up=True)}, name)
                if lo_open:
                    self.assert_refused({name: lo}, name)
                    inside = math.nextafter(lo, math.inf)
                    self.assertEqual(getattr(GenerateConfig.from_dict({name: inside}), name), inside)
                else:
                    self.assertEqual(getattr(GenerateConfig.from_dict({name: lo}), name), lo)
                    self.assert_refused({name: beyond(name, lo, up=False)}, name)

    def test_the_message_states_the_range(self):
        with self.assertRaises(GenerateConfigError) as cm:
            GenerateConfig.from_dict({"top_p": 0})
        self.assertEqual(cm.exception.reason, "must be in (0, 1], got 0")

    def test_unknown_field(self):
        with self.assertRaises(GenerateConfigError) as cm:
            GenerateConfig.from_dict({"max_new_tokens": 2, "top_q": 1})
        self.assertEqual(cm.exception.field, "top_q")
        self.assertIn("unknown field (known: ebnf, end_think_token_ids, force_disable_sp_run, frequency_penalty, ignore_eos,", cm.exception.reason)

    def test_type_errors(self):
        cases = [("max_new_tokens", 1.5), ("max_new_tokens", "8"), ("max_new_tokens", True), ("top_k", None),
                 ("temperature", "x"), ("temperature", math.nan), ("temperature", math.inf), ("temperature", True),
                 ("temperature", 10 ** 400), ("top_p", None), ("ignore_eos", 1), ("return_logprobs", "yes"),
                 ("random_seed", 1.0), ("random_seed", True), ("stop_words_list", 5), ("stop_words_list", [[]]),
                 ("stop_words_list", [[1.5]]), ("stop_words_list", [[True]]), ("stop_words_list", [3]),
                 ("logit_bias", [1]), ("logit_bias", {"x": 1}), ("logit_bias", {"-1": 1}), ("logit_bias", {"1": "a"}),
                 ("logit_bias", {"1": math.nan}), ("logit_bias", {True: 1}), ("logit_bias", {"1": 100.5}),
                 ("logit_bias", {str(i): 1 for i in range(1025)})]
        for name, value in cases:
            with self.subTest(f"{name}={value!r}"):
                self.assert_refused({name: value}, name)

    def test_stop_token_ids_must_fit_int32(self):
        self.assertEqual(GenerateConfig.from_dict({"stop_words_list": [[-I32, I32]]}).stop_words_list, [[-I32, I32]])
        self.assert_refused({"stop_words_list": [[1], [I32 + 1]]}, "stop_words_list")
        self.assert_refused({"stop_words_list": [[-I32 - 1]]}, "stop_words_list")

    def test_logit_bias_takes_json_keys_and_its_bounds(self):
        c = GenerateConfig.from_dict({"logit_bias": {"5": -100, 7: 100, "0": 0.5}})
        self.assertEqual(dict(c.to_proto().logit_bias), {5: -100.0, 7: 100.0, 0: 0.5})

    def test_types_are_checked_before_ranges(self):
        self.assert_refused({"max_new_tokens": 0, "timeout_ms": "soon"}, "timeout_ms")

    def test_to_proto_maps_every_field(self):
        c = GenerateConfig(max_new_tokens=7, min_new_tokens=2, num_return_sequences=3, temperature=0.5, top_k=40,
                           top_p=0.9, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.25,
                           frequency_penalty=-0.5, random_seed=11, ignore_eos=True, stop_words_list=[[5, 6], [7]],
                           return_logprobs=True, top_logprobs=3, logit_bias={9: 1.5}, timeout_ms=900)
        p = c.to_proto(2)
        self.assertEqual(dict(p.logit_bias), {9: 1.5})
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "ignore_eos", "timeout_ms", "top_logprobs"):
            self.assertEqual(getattr(p, name), getattr(c, name), name)
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            self.assertAlmostEqual(getattr(p, name), getattr(c, name), places=6, msg=name)
        self.assertEqual(p.num_return_sequences, 1)  # one stream per sequence
        self.assertEqual(p.random_seed.value, 13)   # random_seed + the sequence index
        self.assertTrue(p.return_softmax_probs)
        self.assertEqual([list(r.values) for r in p.stop_words_list.rows], [[5, 6], [7]])
        self.assertEqual(c.to_proto().random_seed.value, 11)

    def test_to_proto_without_a_seed_leaves_it_unset(self):
        p = GenerateConfig().to_proto(5)
        self.assertFalse(p.HasField("random_seed"))
        self.assertFalse(p.return_softmax_probs)
        self.assertEqual(len(p.stop_words_list.rows), 0)


class FrontendNamesTest(unittest.TestCase):
    def assert_request_error(self, fn, field):
        with self.assertRaises(RequestError) as cm:
            fn()
        self.assertEqual(cm.exception.field, field)
        self.assertTrue(str(cm.exception).startswith(field + ": "), str(cm.exception))
        return cm.exception

    def test_native_fields_come_from_generate_config_or_the_top_level(self):
        config, options = native_config({"prompt": "x", "top_k": 3, "yield_generator": True,
                                         "generate_config": {"top_k": 5, "stop_words_str": ["a"], "min_p": 0.5}})
        self.assertEqual((config.top_k, config.min_p), (5, 0.5))
        self.assertEqual(options, {"stop_words_str": ["a"], "yield_generator": True})

    def test_native_errors_name_the_generate_config_key(self):
        self.assert_request_error(lambda: native_config({"generate_config": {"max_new_tokens": 0}}),
                                  "generate_config.max_new_tokens")
        self.assert_request_error(lambda: native_config({"generate_config": {"bogus": 1}}), "generate_config.bogus")
        self.assert_request_error(lambda: native_config({"generate_config": {"print_stop_words": 1}}),
                                  "generate_config.print_stop_words")
        self.assert_request_error(lambda: native_config({"generate_config": []}), "generate_config")

    def test_openai_names(self):
        config = openai_config({"max_tokens": 9, "seed": 4, "n": 2, "temperature": 0, "top_p": 0.5, "top_k": 3,
                                "min_p": 0.1, "presence_penalty": 1, "frequency_penalty": 1, "repetition_penalty": 2,
                                "ignore_eos": True, "timeout_ms": 5, "min_new_tokens": 3}, default_max=16)
        self.assertEqual((config.max_new_tokens, config.random_seed, config.num_return_sequences), (9, 4, 2))
        self.assertEqual((config.temperature, config.top_p, config.top_k, config.min_p), (0, 0.5, 3, 0.1))
        self.assertEqual((config.presence_penalty, config.frequency_penalty, config.repetition_penalty), (1, 1, 2))
        self.assertTrue(config.ignore_eos)
        for name in NOT_IN_OPENAI:  # not OpenAI fields: ignored
            self.assertEqual(getattr(config, name), DEFAULTS[name], name)

    def test_openai_max_tokens_default_and_chat_override(self):
        self.assertEqual(openai_config({}, default_max=16).max_new_tokens, 16)
        self.assertEqual(openai_config({}, default_max=None).max_new_tokens, 256)
        self.assertEqual(openai_config({"max_tokens": 5, "max_completion_tokens": 7}, None).max_new_tokens, 7)
        self.assertEqual(openai_config({"seed": None, "n": None}, None), GenerateConfig())  # null = absent

    def test_openai_errors_use_openai_names(self):
        for name, (lo, hi, _) in RANGES.items():
            if name in NOT_IN_OPENAI:
                continue
            theirs = OPENAI.get(name, name)
            with self.subTest(theirs):
                self.assert_request_error(lambda: openai_config({theirs: beyond(name, hi, up=True)}, 16), theirs)



class GrammarFieldsTest(unittest.TestCase):
    """The grammar fields (at most one, response_format included) become their StringValue."""

    def test_each_grammar_field_becomes_its_proto_field(self):
        schema = {"type": "object", "properties": {"a": {"enum": [1, 2]}}}
        for cfg, kind, text in [({"json_schema": schema}, "json_schema", json.dumps(schema)),
                                ({"json_schema": json.dumps(schema)}, "json_schema", json.dumps(schema)),
                                ({"json_schema": True}, "json_schema", "true"),
                                ({"regex": "[a-z]+"}, "regex", "[a-z]+"),
                                ({"ebnf": 'root ::= "a"'}, "ebnf", 'root ::= "a"'),
                                ({"structural_tag": {"type": "structural_tag", "format": {"type": "const_string",
                                                                                          "value": "x"}}},
                                 "structural_tag", None),
                                ({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}},
                                 "json_schema", json.dumps(schema)),
                                ({"response_format": {"type": "ebnf", "grammar": 'root ::= "b"'}}, "ebnf",
                                 'root ::= "b"')]:
            with self.subTest(cfg=cfg):
                pb = GenerateConfig.from_dict(cfg).to_proto()
                self.assertTrue(pb.HasField(kind))
                if text is not None:
                    self.assertEqual(getattr(pb, kind).value, text)
                self.assertEqual([k for k in GRAMMAR_FIELDS if pb.HasField(k)], [kind])
        pb = GenerateConfig.from_dict({"response_format": {"type": "text"}}).to_proto()
        self.assertEqual([k for k in GRAMMAR_FIELDS if pb.HasField(k)], [])

    def test_bad_grammar_fields_name_the_field(self):
        for cfg, field in [({"json_schema": 5}, "json_schema"), ({"json_schema": "{"}, "json_schema"),
                           ({"regex": ""}, "regex"), ({"ebnf": 3}, "ebnf"), ({"structural_tag": []}, "structural_tag"),
                           ({"response_format": {"type": "json_schema"}}, "response_format"),
                           ({"regex": "a", "json_schema": {}}, "regex"), ({"regex": "\ud800"}, "regex"),
                           ({"ebnf": 'root ::= "\udfff"'}, "ebnf"), ({"json_schema": {"const": "\ud800"}}, "json_schema"),
                           ({"response_format": {"type": "json_object"}, "regex": "a"}, "regex")]:
            with self.subTest(cfg=cfg), self.assertRaises(GenerateConfigError) as cm:
                GenerateConfig.from_dict(cfg)
            self.assertEqual(cm.exception.field, field)

    def test_choice_is_a_regex_of_escaped_literals(self):
        g = grammars.choice(["a.b", "(c)", "d|e"], "choice")
        self.assertEqual(g.kind, "regex")
        self.assertEqual(g.text, r"(a\.b)|(\(c\))|(d\|e)")
        with self.assertRaises(GrammarError):
            grammars.choice(["ok", 3], "choice")


if __name__ == "__main__":
    unittest.main()
