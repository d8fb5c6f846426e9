"""The OpenAPI document is derived from the request fields' declarations: its ranges equal
GenerateConfig's (native names and OpenAI names), every declared field is in it and nothing
else, and what it calls valid the frontend accepts."""

import math
import unittest
from dataclasses import fields
from typing import Dict

from rtp_llm.config.generate_config import GenerateConfig, GenerateConfigError
from rtp_llm.config.grammar import GRAMMAR_FIELDS
from rtp_llm.config.upstream_generate_fields import IGNORED, REFUSED
from rtp_llm.frontend.openapi import openapi_spec
from rtp_llm.frontend.request import NATIVE_OPTIONS, OPENAI_NAMES


def schemas():
    return openapi_spec("m")["components"]["schemas"]


def scalar(schema):
    """The schema itself, or a token id list's item schema, or a token id map's value schema."""
    while schema.get("type") in ("array", "object"):
        schema = schema["items"] if schema["type"] == "array" else schema["additionalProperties"]
    return schema


def numeric(schema):
    """A numeric schema as (lo, hi, lo_open)."""
    schema = scalar(schema)
    return schema["minimum"], schema["maximum"], "exclusiveMinimum" in schema


class OpenApiTest(unittest.TestCase):
    def test_generate_config_schema_has_every_declared_field_and_nothing_else(self):
        props = schemas()["GenerateConfig"]["properties"]
        self.assertEqual(set(props), {f.name for f in fields(GenerateConfig)} | set(NATIVE_OPTIONS) | set(IGNORED)
                         | set(REFUSED))
        self.assertFalse(schemas()["GenerateConfig"]["additionalProperties"])
        for f in fields(GenerateConfig):
            self.assertEqual(props[f.name]["description"], f.metadata["doc"], f.name)

    def test_ranges_equal_the_declaration(self):
        props = schemas()["GenerateConfig"]["properties"]
        for f in fields(GenerateConfig):
            r = f.metadata["range"]
            with self.subTest(f.name):
                if f.name in ("response_format",) + GRAMMAR_FIELDS:  # shapes, not ranges
                    self.assertNotIn(props[f.name].get("type"), ("integer", "number", "boolean"))
                    continue
                if r is None:
                    self.assertEqual(props[f.name]["type"], "boolean")
                    continue
                self.assertEqual(numeric(props[f.name]), (r.lo, r.hi, r.lo_open))
                numbers = f.type is float or f.type == Dict[int, float]  # a token id map's values
                self.assertEqual(scalar(props[f.name])["type"], "number" if numbers else "integer")

    def test_openai_routes_carry_the_same_ranges_under_openai_names(self):
        native = schemas()["GenerateConfig"]["properties"]
        for route in ("ChatCompletionRequest", "CompletionRequest"):
            props = schemas()[route]["properties"]
            for ours, theirs in OPENAI_NAMES.items():
                with self.subTest(f"{route}.{theirs}"):
                    self.assertEqual(props[theirs], native[ours])
            for ours in ("min_new_tokens", "timeout_ms", "stop_words_list", "return_logprobs"):
                self.assertNotIn(ours, props)
        self.assertEqual(schemas()["ChatCompletionRequest"]["properties"]["max_completion_tokens"],
                         native["max_new_tokens"])

    def test_what_the_spec_calls_valid_is_accepted_and_its_edges_are_refused(self):
        props = schemas()["GenerateConfig"]["properties"]
        for name in (f.name for f in fields(GenerateConfig)):
            if props[name].get("type") not in ("integer", "number"):
                continue
            lo, hi, lo_open = numeric(props[name])
            number = props[name]["type"] == "number"
            below = math.nextafter(lo, -math.inf) if number else lo - 1
            above = math.nextafter(hi, math.inf) if number else hi + 1
            with self.subTest(name):
                GenerateConfig.from_dict({name: hi})
                GenerateConfig.from_dict({name: math.nextafter(lo, math.inf) if lo_open else lo})
                for bad in (above, lo if lo_open else below):
                    with self.assertRaises(GenerateConfigError):
                        GenerateConfig.from_dict({name: bad})


if __name__ == "__main__":
    unittest.main()
