"""The incremental detokenizer on the real tokenizers (SmolLM2's, from its GGUF file; Qwen3's
and Qwen2.5's): whatever the chunking, its deltas add up to what decoding the whole sequence
gives, special tokens skipped, and the fast path it takes decodes as transformers does."""

import os
import random

import pytest

from rtp_llm.frontend.detokenizer import IncrementalDetokenizer, text_decoder
from rtp_llm.model_loader import load_tokenizer


@pytest.fixture(scope="module", params=["smollm2", "qwen3", "qwen25"])
def tokenizer(request, model_cache, smollm2, qwen25):
    path = {"smollm2": smollm2, "qwen3": os.path.join(model_cache, "qwen3-tokenizer"), "qwen25": qwen25}
    return load_tokenizer(path[request.param])


def random_sequences(tokenizer, count=60, seed=0):
    """Random ids, some with special tokens, and real text's ids (multi-byte characters split
    across tokens)."""
    rng = random.Random(seed)
    text = "Grüße aus Köln! 你好，世界。 Emoji: 🚀🎉 — naïve café, ½ ≈ 0.5; \n\tcode: x += 1"
    out = [tokenizer.encode(text, add_special_tokens=False)]
    for i in range(count):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 60))]
        if i % 3 == 0:
            ids[rng.randrange(len(ids))] = rng.choice(tokenizer.all_special_ids)
        out.append(ids)
    return out


def test_the_fast_path_decodes_as_transformers_does(tokenizer):
    fast = text_decoder(tokenizer)
    for ids in random_sequences(tokenizer):
        assert fast(ids, skip_special_tokens=True) == tokenizer.decode(ids, skip_special_tokens=True)


def test_deltas_add_up_to_the_whole_decode_whatever_the_chunking(tokenizer):
    rng = random.Random(1)
    for ids in random_sequences(tokenizer):
        for max_chunk in (1, 3, 8):
            d = IncrementalDetokenizer(tokenizer)
            text, i = "", 0
            while i < len(ids):
                n = rng.randint(1, max_chunk)
                text += d.add(ids[i:i + n])
                i += n
            text += d.finish()
            assert text == tokenizer.decode(ids, skip_special_tokens=True), (ids, max_chunk)
