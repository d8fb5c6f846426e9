"""The engine on a CUDA GPU against HF transformers on the tiny fixture checkpoints (GQA, MQA,
tied and untied; Qwen3, Qwen2, Llama; Qwen3-MoE and Qwen2-MoE; DeepSeek-V2/V3): greedy tokens
equal for mixed-length batches, with chunked prefill, the prefix cache and preemption, with CUDA
graphs and overlapped scheduling on and off; logits within a tolerance; the sampler's request-driven paths (top-k alternatives,
logit_bias, a thinking budget's forced tokens, no_repeat_ngram_size) through the graphs and
eagerly. Marked `gpu`: skipped where torch sees no GPU."""

import pytest
import torch
from interpreted_triton import step_logits
from testlib import (TINY, TINY_MLA, TINY_MOE, hf_greedy, hf_logprobs, hf_model, make_tiny, overlap_sampling_configs,
                     random_prompts)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

NEW_TOKENS = 48


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tiny"))
    paths = {name: make_tiny(name, root) for name in (*TINY, *TINY_MOE, *TINY_MLA)}
    hf = {name: hf_model(p) for name, p in paths.items()}
    return paths, hf


def _llm(path, **kw):
    from rtp_llm.llm import LLM

    kw.setdefault("act_type", "fp32")
    return LLM(path, progress=False, device="cuda", max_seq_len=256, **kw)


def _check_greedy(paths, hf, name, batch, **kw):
    llm = _llm(paths[name], **kw)
    try:
        outs = llm.generate(batch, {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True})
        for prompt, out in zip(batch, outs):
            assert out.outputs[0].token_ids == hf_greedy(hf[name], prompt, NEW_TOKENS), (name, len(prompt), kw)
        return llm.engine.core.stats()
    finally:
        llm.close()


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("name", ["qwen3_gqa_untied", "qwen2_mqa_tied", "llama_gqa_tied", "llama_mha_untied",
                                  *TINY_MOE, *TINY_MLA])
def test_greedy_tokens_equal_hf_mixed_batch(tiny, name, graphs):
    # (MoE models too: their routed experts on the fused kernel, DeepSeek's attention on the
    # latent kernel, in graphs where asked.)
    paths, hf = tiny
    _check_greedy(paths, hf, name, random_prompts(1, [3, 17, 40, 9, 64, 1, 120]), cuda_graph=graphs)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "in_turn"])
@pytest.mark.parametrize("name", ["qwen3_gqa_untied", "llama_mha_untied"])
def test_chunked_prefill_prefix_cache_and_preemption(tiny, name, overlap):
    paths, hf = tiny
    _check_greedy(paths, hf, name, random_prompts(2, [50, 33, 7]), max_num_batched_tokens=16, overlap_schedule=overlap)
    # 20 blocks: short enough that overlapped steps (which wait rather than preempt) preempt too.
    stats = _check_greedy(paths, hf, name, random_prompts(5, [30, 36, 25, 40, 31]), num_kv_blocks=20, warm_up=False,
                          overlap_schedule=overlap)
    assert stats["preemptions"] > 0 and stats["used_blocks"] == 0
    shared = random_prompts(3, [48])[0]
    batch = random_prompts(4, [5, 11, 20], prefix=shared)
    llm = _llm(paths[name], overlap_schedule=overlap)
    try:
        cfg = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
        first = llm.generate(batch[0], cfg)[0]
        rest = llm.generate(batch[1:], cfg)
        for prompt, out in zip(batch, [first] + rest):
            assert out.outputs[0].token_ids == hf_greedy(hf[name], prompt, NEW_TOKENS)
        assert all(o.aux_info["reuse_len"] >= 48 for o in rest)
    finally:
        llm.close()


def test_overlap_is_on_by_default_and_samples_the_same(tiny):
    paths, _ = tiny
    batch = random_prompts(7, [12, 30, 5])
    configs = overlap_sampling_configs(batch[2][-1])
    outs = []
    for overlap in (None, False):
        llm = _llm(paths["qwen3_gqa_untied"], overlap_schedule=overlap)
        try:
            assert llm.engine.overlap == (overlap is None)
            outs.append([o.outputs[0].token_ids for o in llm.generate(batch, configs)])
        finally:
            llm.close()
    assert outs[0] == outs[1]


@pytest.mark.parametrize("dtype,tol", [("fp32", 1e-4), ("bf16", 0.1)])
def test_prefill_and_decode_logits_match_hf(tiny, dtype, tol):
    paths, hf = tiny
    name = "qwen3_gqa_untied"
    prompt = random_prompts(6, [37])[0]
    llm = _llm(paths[name], act_type=dtype)
    try:
        (prefill, decode), generated = step_logits(llm, prompt)
    finally:
        llm.close()
    model = hf_model(paths[name], torch.float32 if dtype == "fp32" else torch.bfloat16, device="cuda")
    with torch.inference_mode():
        ref = model(torch.tensor([prompt + generated[:1]], device="cuda")).logits[0].float().cpu()
    # bf16: both sides round differently (fused vs separate projections), so the bar is
    # relative to the logits' scale rather than exact.
    scale = ref.abs().max().item() if dtype == "bf16" else 1.0
    torch.testing.assert_close(prefill, ref[-2], atol=tol * scale, rtol=0 if dtype == "bf16" else tol)
    torch.testing.assert_close(decode, ref[-1], atol=tol * scale, rtol=0 if dtype == "bf16" else tol)


def test_seeded_sampling_is_reproducible_across_batch_composition(tiny):
    paths, _ = tiny
    llm = _llm(paths["llama_gqa_tied"])
    try:
        cfg = {"max_new_tokens": 24, "temperature": 1.0, "top_p": 0.9, "random_seed": 7}
        alone = llm.generate(random_prompts(8, [10])[0], cfg)[0].outputs[0].token_ids
        crowd = llm.generate(random_prompts(9, [4, 30]) + random_prompts(8, [10]),
                             [{"max_new_tokens": 24, "temperature": 1.0}] * 2 + [cfg])
        assert crowd[2].outputs[0].token_ids == alone
    finally:
        llm.close()


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_sampler_request_paths_on_cuda(tiny, graphs):
    paths, hf = tiny
    name, k = "qwen3_gqa_untied", 4
    prompts = random_prompts(10, [9, 23])
    llm = _llm(paths[name], cuda_graph=graphs)
    try:
        outs = llm.generate(prompts, {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True, "top_logprobs": k,
                                      "return_logprobs": True})
        for prompt, out in zip(prompts, outs):  # alternatives: HF's fp32 log-softmax, best first
            seq = out.outputs[0]
            ids = prompt + seq.token_ids
            top = hf_logprobs(hf[name], ids)[len(prompt) - 1:len(ids) - 1].topk(k, dim=-1)
            assert len(seq.top_logprobs) == len(seq.token_ids)
            for tok, lp, alts, want_ids, want_lps in zip(seq.token_ids, seq.logprobs, seq.top_logprobs,
                                                         top.indices.tolist(), top.values.tolist()):
                assert [i for i, _ in alts] == want_ids and tok == want_ids[0]
                assert max(abs(v - w) for (_, v), w in zip(alts, want_lps)) < 1e-4 and abs(lp - want_lps[0]) < 1e-4
        forced = 7
        out = llm.generate(prompts[0], {"max_new_tokens": 6, "temperature": 1.0, "ignore_eos": True,
                                        "logit_bias": {forced: 100}})[0]
        assert out.outputs[0].token_ids == [forced] * 6
        out = llm.generate(prompts[1], {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True,
                                        "max_thinking_tokens": 2, "in_think_mode": True,
                                        "end_think_token_ids": [11, 12]})[0]
        assert out.outputs[0].token_ids[2:4] == [11, 12]
        out = llm.generate(prompts[0], {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True,
                                        "no_repeat_ngram_size": 2})[0]
        seq = prompts[0] + out.outputs[0].token_ids
        for i in range(len(prompts[0]) - 1, len(seq) - 1):  # each bigram that ends in the output is new
            assert (seq[i], seq[i + 1]) not in set(zip(seq[:i], seq[1:i + 1])), i
    finally:
        llm.close()


def test_host_gate_holds_the_stream_until_the_host_opens_it():
    # What a grammar step relies on (mask_filler.py): work queued behind gate.wait(t) runs only
    # after open(t) from another host thread; a wait for a ticket already opened passes at once.
    # (The add kernel is loaded before the wait: CUDA loads kernels lazily, and a load waits for
    # the context's streams, so this thread would wait for itself. The engine's kernels are
    # loaded by warm-up; one loaded later waits for the fill thread to open the gate.)
    import threading
    import time

    from rtp_llm.device.cuda.backend import CudaBackend

    gate = CudaBackend().host_gate()
    assert gate is not None, "this driver has no 64-bit stream waits"
    x = torch.zeros(1, device="cuda")
    x.add_(1)
    torch.cuda.synchronize()
    ticket = gate.next()
    gate.wait(ticket)
    x.add_(1)
    held = torch.cuda.Event()
    held.record()
    time.sleep(0.05)
    assert not held.query()  # (x.item() here would wait forever: the stream is held)
    opener = threading.Timer(0.05, gate.open, args=(ticket,))
    opener.start()
    held.synchronize()
    gate.wait(ticket)
    x.add_(1)
    torch.cuda.synchronize()
    assert x.item() == 3


def test_a_native_thread_copies_to_the_device_before_it_opens_the_gate():
    # host_gate.worker_copy's calls, run on the core's FillWorker thread as a grammar step's job
    # runs them after its fill: what the compute stream reads behind the gate is the copied mask.
    import numpy as np

    from rtp_llm.async_decoder_engine.native_fill import _bind
    from rtp_llm.device.cuda.backend import CudaBackend
    from rtp_llm.ops import ensure_engine_ops_loaded

    gate = CudaBackend().host_gate()
    assert gate is not None and gate.copies_on_worker
    host = torch.arange(64 * 4748, dtype=torch.int32).view(64, 4748).pin_memory()
    dev = torch.zeros(host.shape, dtype=torch.int32, device="cuda")
    out = torch.empty_like(dev)
    out.copy_(dev)
    torch.cuda.synchronize()
    lib = _bind(ensure_engine_ops_loaded())
    worker = lib.rtp_llm_fill_worker_create()
    try:
        calls = gate.worker_copy(host, dev)
        specs, results = np.zeros((len(calls), 5), dtype=np.int64), np.zeros((len(calls), 2), dtype=np.int64)
        for i, call in enumerate(calls):
            specs[i, :4], specs[i, 4] = call, results.ctypes.data + 16 * i
        ticket = gate.next()
        gate.wait(ticket)
        out.copy_(dev)  # (behind the gate)
        assert lib.rtp_llm_fill_worker_submit(worker, specs.ctypes.data, len(calls), gate.counter_address(),
                                              ticket) == 0
        assert lib.rtp_llm_fill_worker_wait(worker, None) == 0
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), host)
        assert (results[:, 1] == 0).all()  # each driver call returned CUDA_SUCCESS
    finally:
        lib.rtp_llm_fill_worker_destroy(worker)
