"""A mixture-of-experts model served from the installed wheel: the server on tiny random
Qwen3-MoE and Qwen2-MoE checkpoints (with the tiny tokenizer), tensor-parallel over two CPU
ranks, answers with HF transformers' greedy tokens."""

import json

import pytest
from testlib import add_tiny_tokenizer, hf_greedy, hf_model, make_tiny, post_json, start_server, stop_server

PROMPT = '{"name": "Ada", "tags": ["x", "yy"], "ok": true, "n": '
NEW_TOKENS = 16


@pytest.mark.parametrize("name", ["qwen3_moe_dense_first", "qwen2_moe_shared"])
def test_tp2_server_answers_hf_greedy_tokens(tmp_path, name):
    path = add_tiny_tokenizer(make_tiny(name, str(tmp_path)))
    proc, base = start_server(path, "--tp_size=2", frontends=1)
    try:
        status, body = post_json(base + "/", {"prompt": PROMPT, "generate_config": {
            "max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True, "return_input_ids": True,
            "return_output_ids": True}})
        assert status == 200, body
        out = json.loads(body)
    finally:
        assert stop_server(proc, timeout=90) == 0
    assert len(out["input_ids"]) > 5
    assert out["output_ids"] == hf_greedy(hf_model(path), out["input_ids"], NEW_TOKENS)
