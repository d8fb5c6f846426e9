"""The load client (python -m rtp_llm.tools.bench_serve) against the real server on the
embedded model: several client processes, every request answered with exactly its tokens,
its own CPU and the server's samples in the report, and more streams in flight than
aiohttp's default connection cap (100) would allow."""

import json
import subprocess
import sys

import pytest
from testlib import start_server, stop_server

# Per frontend: high enough that 128 streams over 2 frontends are never refused.
CONCURRENCY_LIMIT = 256


@pytest.fixture(scope="module")
def server(smollm2):
    proc, base = start_server(smollm2, f"--concurrency_limit={CONCURRENCY_LIMIT}")
    yield base
    assert stop_server(proc) == 0


def bench(base: str, tmp_path, *flags) -> dict:
    out = tmp_path / "report.json"
    res = subprocess.run([sys.executable, "-m", "rtp_llm.tools.bench_serve", "--base_url", base, *flags,
                          "--json_out", str(out)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "output tok/s" in res.stdout
    return json.loads(out.read_text())


def test_two_client_processes_every_token_delivered(server, tmp_path):
    num_prompts, output_len = 16, 8
    r = bench(server, tmp_path, "--concurrency", "8", "--client_procs", "2", "--num_prompts", str(num_prompts),
              "--input_len", "16", "--output_len", str(output_len))
    assert r["completed"] == num_prompts and r["failed"] == 0, r["errors"]
    assert r["client_procs"] == 2
    assert r["output_tokens"] == num_prompts * output_len
    assert r["prompt_tokens"] == num_prompts * 16  # token-id prompts: exactly input_len tokens each
    assert r["tpot_ms"]["p50"] > 0 and r["itl_ms"]["p99"] >= r["itl_ms"]["p50"] > 0
    assert r["tokens_per_chunk"] >= 1
    cpu = r["client_cpu"]
    assert cpu["processes"] == 2 and cpu["cpu_s"] > 0 and cpu["cores_used"] > 0
    assert cpu["max_process_core_fraction"] > 0 and isinstance(cpu["saturated"], bool)
    s = r["server"]
    assert s["available"] is True, s
    assert s["samples"] >= 2
    # The window's first sample precedes every request and its last follows every response.
    assert s["generated_tokens_delta"] >= r["output_tokens"]
    assert s["engine_output_tok_s"] > 0 and s["running_streams_max"] >= 1


def test_more_streams_than_the_default_connection_cap(server, tmp_path):
    """128 concurrent streams from one client process: the engine holds them all at once
    (running + waiting), which aiohttp's default connector (100 connections) never allowed."""
    r = bench(server, tmp_path, "--concurrency", "128", "--client_procs", "1", "--num_prompts", "128",
              "--input_len", "8", "--output_len", "16")
    assert r["completed"] == 128 and r["failed"] == 0, r["errors"]
    assert r["server"]["in_engine_max"] > 100, r["server"]
