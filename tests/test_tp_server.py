"""Tensor-parallel serving on the CPU (gloo) with Qwen2.5-0.5B (14 heads, 2 KV heads: one per
rank): one launcher with two ranks, and two launchers ("nodes") meeting over TCP on loopback.
The answer equals the single-process offline one; a node going away takes the server down
with a non-zero exit instead of hanging."""

import json
import subprocess

import pytest
from testlib import free_port, post_json, server_argv, start_server, stop_server

PROMPT = "The capital of France is"
CONFIG = {"max_new_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def offline_answer(qwen25):
    from rtp_llm.llm import LLM

    llm = LLM(qwen25, act_type="fp32", progress=False, max_seq_len=2048, kv_cache_mem_mb=256)
    try:
        return llm.generate(PROMPT, CONFIG)[0].outputs[0].text
    finally:
        llm.close()


def _answer(base):
    status, body = post_json(base + "/", {"prompt": PROMPT, "generate_config": CONFIG})
    assert status == 200, body
    return json.loads(body)["response"]


def test_tp2_on_one_node_answers_like_tp1(qwen25, offline_answer):
    assert "Paris" in offline_answer
    proc, base = start_server(qwen25, "--tp_size=2", frontends=1)
    try:
        assert _answer(base) == offline_answer
    finally:
        assert stop_server(proc, timeout=90) == 0  # rank 0 stopped rank 1: both exit cleanly


def test_two_nodes_over_tcp_and_a_lost_node_stops_the_server(qwen25, offline_answer):
    master_port = free_port()
    common = ["--tp_size=2", "--world_size=2", "--local_world_size=1", "--master_addr=127.0.0.1",
              f"--master_port={master_port}", "--dist_timeout_s=30"]
    node1 = subprocess.Popen(server_argv(qwen25, free_port(), "--act_type=fp32", "--kv_cache_mem_mb=256",
                                         "--max_seq_len=2048", "--world_rank=1", *common))
    node0 = None
    try:
        node0, base = start_server(qwen25, "--world_rank=0", *common, frontends=1)
        assert _answer(base) == offline_answer
        assert stop_server(node1) == 0  # node 1 stops its rank; rank 0 finds out at its next step
        try:
            post_json(base + "/", {"prompt": PROMPT, "generate_config": CONFIG}, timeout=60)
        except Exception:
            pass  # the frontends may already be going down
        assert node0.wait(timeout=90) != 0
    finally:
        for p in (node0, node1):
            if p is not None and p.poll() is None:
                p.kill()
