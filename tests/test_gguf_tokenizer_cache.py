"""A GGUF file's tokenizer is converted by transformers once and read from the cache after
(model_loader.gguf_loader.load_gguf_tokenizer): the cached one must behave as the converted one,
and a cache left unreadable must not stop a load."""

import os

from rtp_llm.model_loader.gguf_loader import _tokenizer_cache, load_gguf_tokenizer

TEXTS = ["Hello, world! héllo 你好 🤖", "def f(x):\n    return x ** 2\n", "<|im_start|>user\nhi<|im_end|>"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


def test_the_cached_tokenizer_is_the_converted_one(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached = _tokenizer_cache(smollm2)
    assert cached.startswith(str(tmp_path)) and not os.path.exists(cached)
    converted = load_gguf_tokenizer(smollm2)
    assert os.path.isfile(os.path.join(cached, "tokenizer.json"))
    loaded = load_gguf_tokenizer(smollm2)
    assert loaded.name_or_path == cached  # (read from the cache, not converted again)
    assert type(loaded) is type(converted)
    assert loaded.get_vocab() == converted.get_vocab()
    assert loaded.all_special_tokens == converted.all_special_tokens
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == \
           (converted.bos_token_id, converted.eos_token_id, converted.pad_token_id)
    for text in TEXTS:
        ids = converted.encode(text)
        assert loaded.encode(text) == ids, text
        assert loaded.decode(ids, skip_special_tokens=True) == converted.decode(ids, skip_special_tokens=True)
    assert loaded.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == \
           converted.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)


def test_an_unreadable_cache_is_converted_around(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached = _tokenizer_cache(smollm2)
    os.makedirs(cached)
    with open(os.path.join(cached, "tokenizer_config.json"), "w") as f:
        f.write("{not json")
    tokenizer = load_gguf_tokenizer(smollm2)
    assert tokenizer.decode(tokenizer.encode("Paris")) == "Paris"
