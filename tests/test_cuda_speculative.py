"""Speculative decoding on a CUDA GPU against HF transformers on the tiny fixtures: the greedy
tokens are HF's with prompt lookup and with a draft model (the target itself: every draft
accepted, so the draft's mirrored KV cache is right; or an unrelated model of other head counts),
through captured graphs (steps without drafts, the draft's proposal steps and its mirror) and
eagerly, overlapped, with chunked prefill; an EAGLE-3 head (random, on a 4-layer target) gives the
plain greedy tokens and proposes exactly the drafts a plain-torch head computes over the HF
target's hidden states (eagle3_ref.py), drafts forced through or not; so does DeepSeek-V3's MTP
layer against HF's decoder layer (mtp_ref.py). Marked `gpu`: skipped where
torch sees no GPU."""

import functools

import pytest
import torch
from eagle3_ref import EAGLE_TARGET, assert_head_drafts, reference_drafts, write_eagle3_head
from mtp_ref import add_mtp_layer, reference_mtp_drafts
from testlib import hf_greedy, hf_model, make_loopy, make_tiny, random_prompts, repetitive_prompts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

NEW_TOKENS = 48


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("spec"))
    loopy = make_loopy(root)
    return {"loopy": loopy, "other": make_tiny("llama_mha_untied", root)}, hf_model(loopy)


def _prompts():
    return repetitive_prompts() + random_prompts(9, [70])


@pytest.mark.parametrize("chunk", [0, 16], ids=["whole", "chunked"])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("drafter", ["ngram", "self", "other"])
def test_greedy_tokens_equal_hf_with_drafts(models, drafter, graphs, chunk):
    from rtp_llm.config.speculative import SpeculativeConfig
    from rtp_llm.llm import LLM

    paths, hf = models
    spec = (SpeculativeConfig("ngram", 4, 1, 3) if drafter == "ngram" else
            SpeculativeConfig("vanilla", 4, sp_checkpoint_path=paths["loopy" if drafter == "self" else "other"]))
    extra = {"max_num_batched_tokens": chunk} if chunk else {}
    llm = LLM(paths["loopy"], act_type="fp32", progress=False, device="cuda", max_seq_len=256, speculative=spec,
              cuda_graph=graphs, **extra)
    try:
        prompts = _prompts()
        outs = llm.generate(prompts, {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True})
        for prompt, out in zip(prompts, outs):
            assert out.outputs[0].token_ids == hf_greedy(hf, prompt, NEW_TOKENS), (drafter, graphs, len(prompt))
        stats = llm.engine.core.stats()
    finally:
        llm.close()
    assert stats["spec_draft_tokens"] > 0, stats
    if drafter == "self":
        assert stats["spec_accepted_tokens"] == stats["spec_draft_tokens"], stats
    elif drafter == "ngram":
        assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"], stats
    assert stats["used_blocks"] == 0


@pytest.fixture(scope="module")
def eagle(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("eagle3"))
    target = make_tiny("qwen3_4layers", root, spec=EAGLE_TARGET)
    return target, write_eagle3_head(f"{root}/head", target, seed=1, draft_vocab=200)


def _check_head_drafts(target, spec, reference, graphs: bool, chunk: int, forced: float, monkeypatch):
    """A drafting head (eagle3 / mtp) on CUDA: the plain greedy tokens (HF's), every proposal equal
    to `reference`'s, drafts forced through at `forced` or not."""
    from rtp_llm.async_decoder_engine.draft_model import FORCE_ACCEPT_ENV
    from rtp_llm.llm import LLM

    if forced:
        monkeypatch.setenv(FORCE_ACCEPT_ENV, str(forced))
    extra = {"max_num_batched_tokens": chunk} if chunk else {}
    llm = LLM(target, act_type="fp32", progress=False, device="cuda", max_seq_len=256, cuda_graph=graphs,
              speculative=spec, **extra)
    hf = None if forced else hf_model(target)
    assert_head_drafts(llm, reference, random_prompts(5, [6, 21, 40]), 20,
                       None if forced else (lambda prompt: hf_greedy(hf, prompt, 20)))


@pytest.mark.parametrize("forced", [0.0, 0.6], ids=["model", "forced"])
@pytest.mark.parametrize("chunk", [0, 16], ids=["whole", "chunked"])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_eagle3_drafts_are_the_heads(eagle, graphs, chunk, forced, monkeypatch):
    from rtp_llm.config.speculative import SpeculativeConfig

    target, head = eagle
    _check_head_drafts(target, SpeculativeConfig("eagle3", 3, sp_checkpoint_path=head),
                       functools.partial(reference_drafts, target, head), graphs, chunk, forced, monkeypatch)


@pytest.mark.parametrize("forced", [0.0, 0.6], ids=["model", "forced"])
@pytest.mark.parametrize("chunk", [0, 16], ids=["whole", "chunked"])
def test_mtp_drafts_are_the_layers(tmp_path_factory, chunk, forced, monkeypatch):
    from rtp_llm.config.speculative import SpeculativeConfig

    target = add_mtp_layer(make_tiny("deepseek_v3_noaux", str(tmp_path_factory.mktemp("mtp"))), seed=3)
    _check_head_drafts(target, SpeculativeConfig("mtp", 3), functools.partial(reference_mtp_drafts, target), True,
                       chunk, forced, monkeypatch)
