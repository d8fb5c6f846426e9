"""The CUDA backend's fused MoE (kernels/moe.py) against device/base.py's moe_reference, and
MoE models through the CUDA step path with graphs. Without a GPU through Triton's interpreter."""

import json

import pytest
import torch
from interpreted_triton import DEV, DTYPES, INTERPRETED, assert_greedy_equals_hf, skip_interpreted_bf16_dot

from rtp_llm.device.base import moe_reference
from rtp_llm.device.cuda import kernels as K
from rtp_llm.device.cuda.kernels.moe import MoeGemmConfig, fit_shared_memory, group_by_expert, max_rows, moe_config
from rtp_llm.device.cuda.kernels.moe_tuned import to_json
from rtp_llm.models_py.moe import route

# Group sizes 1 and 3 (a last group of fewer blocks) walk the tiles in different orders.
CONFIGS = [MoeGemmConfig(16, 32, 32, 1, 4, 2), MoeGemmConfig(32, 64, 64, 3, 4, 2), MoeGemmConfig(64, 32, 16, 8, 4, 2)]


def _routing(t: int, k: int, e: int, seed: int, dtype, skew: bool = False):
    """topk_ids [T, K] (distinct experts per token) and normalized weights [T, K]; skew: most
    pairs on two experts, the others empty or nearly (many padding rows)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(t, e, generator=g)
    if skew:
        scores[:, :2] += 10
    ids = scores.topk(k, dim=-1).indices
    w = torch.rand(t, k, generator=g) + 0.1
    return ids.to(DEV), (w / w.sum(-1, keepdim=True)).to(dtype).to(DEV)


@pytest.mark.parametrize("t,k,e,skew", [(1, 1, 3, False), (5, 2, 7, False), (37, 3, 5, False), (64, 2, 9, True)])
def test_grouping_places_every_pair_once_in_its_experts_blocks(t, k, e, skew):
    ids, _ = _routing(t, k, e, t, torch.float32, skew)
    for block_m in (16, 32):
        rows, block_expert = group_by_expert(ids, e, block_m)
        rows, block_expert = rows.cpu(), block_expert.cpu()
        p = t * k
        assert len(rows) == max_rows(p, e, block_m) and len(block_expert) * block_m == len(rows)
        real = rows[rows < p]
        assert sorted(real.tolist()) == list(range(p))                 # each pair exactly once
        assert torch.all(rows[rows >= p] == p)                           # padding says "no pair"
        flat = ids.reshape(-1).cpu()
        blocks = rows.view(-1, block_m)
        used = block_expert >= 0
        # A used block holds its expert's pairs only (and padding); unused ones hold none, and
        # come after every used one.
        for b in torch.nonzero(used).flatten().tolist():
            r = blocks[b][blocks[b] < p]
            assert len(r) and torch.all(flat[r] == block_expert[b])
        assert torch.all(blocks[~used] == p)
        n_used = int(used.sum())
        assert torch.all(used[:n_used]) and sorted(block_expert[:n_used].tolist()) == block_expert[:n_used].tolist()
        counts = torch.bincount(flat, minlength=e)
        assert n_used == int(sum(-(-c // block_m) for c in counts.tolist()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,k,e,i,h", [(1, 2, 5, 24, 40), (9, 3, 7, 40, 72), (70, 2, 3, 16, 48), (0, 2, 3, 16, 32)])
def test_fused_moe_equals_the_reference(dtype, t, k, e, i, h):
    # Ragged I and H (masked tiles), odd expert counts, a token count that is not a tile's.
    skip_interpreted_bf16_dot(dtype)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(t, h, generator=g).to(dtype).to(DEV)
    gate_up = (torch.randn(e, 2 * i, h, generator=g) / h ** 0.5).to(dtype).to(DEV)
    down = (torch.randn(e, h, i, generator=g) / i ** 0.5).to(dtype).to(DEV)
    ids, w = _routing(t, k, e, 3, dtype)
    expected = moe_reference(x, gate_up, down, w, ids, K.silu_and_mul)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -5, atol=2e-2)
    for cfg in CONFIGS + [None]:
        torch.testing.assert_close(K.moe(x, gate_up, down, w, ids, cfg), expected, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,e,k,norm", [(1, 8, 2, True), (7, 9, 3, False), (33, 128, 8, True), (2, 5, 1, True)])
def test_fused_routing_equals_route(dtype, t, e, k, norm):
    # Softmax in fp32, the K largest in descending order, renormalized: route()'s answer. bf16
    # logits tie often (128 of them): equal scores may come in another order than torch.topk's
    # (which leaves it unspecified), so there the chosen experts must score what route()'s do.
    logits = torch.randn(t, e, generator=torch.Generator().manual_seed(t)).to(dtype).to(DEV)
    weights, ids = K.moe_route(logits, k, norm)
    want_w, want_ids = route(logits, k, norm)
    assert ids.dtype == torch.int64
    if dtype == torch.float32:
        assert torch.equal(ids.cpu(), want_ids.cpu())
    probs = torch.softmax(logits.cpu().float(), dim=-1)
    assert torch.equal(probs.gather(1, ids.cpu()), probs.gather(1, want_ids.cpu()))
    assert all(len(set(row)) == k for row in ids.cpu().tolist())
    # bf16: rounded once from the same fp32 value (the interpreter truncates: a unit more).
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == torch.float32 else dict(rtol=2 ** -(6 if INTERPRETED else 8), atol=0)
    torch.testing.assert_close(weights.cpu(), want_w.cpu(), **tol)


def test_fused_routing_of_garbage_logits_stays_in_range():
    # A captured graph's padding rows route whatever their hidden states hold, NaN and inf too:
    # an id out of [0, E) would make the grouping write out of bounds.
    logits = torch.tensor([[float("nan")] * 6, [float("inf"), 1.0, float("-inf"), float("nan"), 0.0, 2.0],
                           [float("-inf")] * 6], device=DEV)
    _, ids = K.moe_route(logits, 3, True)
    assert all(0 <= i < 6 for i in ids.flatten().tolist())
    assert all(len(set(row)) == 3 for row in ids.cpu().tolist())


def test_default_configs_by_rows_per_expert():
    # Decode (a few rows an expert) takes 16-row blocks; long prompts large tiles.
    assert moe_config(1, 8, 128).block_m == 16
    assert moe_config(512, 8, 128).block_m == 32
    assert moe_config(8192, 8, 128).block_m == 128
    assert max_rows(8, 128, 16) == 128  # 8 pairs, at most 8 experts padded


def test_configs_shrink_to_the_shared_memory_a_device_has():
    big = MoeGemmConfig(128, 128, 64, 1, 8, 3)  # 144 KiB in bf16: an H200's, not a 99 KiB GPU's
    assert fit_shared_memory(big, 2, 227 * 1024) == big
    small = fit_shared_memory(big, 2, 99 * 1024)
    assert small.shared_bytes(2) <= 99 * 1024 and (small.block_m, small.block_n) == (128, 128)
    assert fit_shared_memory(big, 2, None) == big


def test_tuned_configs_from_a_file_win_by_the_nearest_token_count(tmp_path, monkeypatch):
    key = ("NVIDIA H200", 128, 768, 2048, 8, "bfloat16")
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps([to_json(key, {1: (16, 32, 64, 1, 4, 3), 64: (32, 128, 64, 8, 8, 4)})]))
    monkeypatch.setenv("RTP_LLM_MOE_TUNED", str(path))
    assert moe_config(2, 8, 128, key) == MoeGemmConfig(16, 32, 64, 1, 4, 3)
    assert moe_config(40, 8, 128, key) == MoeGemmConfig(32, 128, 64, 8, 8, 4)
    other = ("NVIDIA H200", 64, 1408, 2048, 6, "bfloat16")  # no entry: the rule of thumb
    assert moe_config(40, 6, 64, other) == moe_config(40, 6, 64)


@pytest.mark.skipif(not INTERPRETED, reason="on a GPU, tests/test_cuda.py runs the real backend")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-inputs"])
@pytest.mark.parametrize("name", ["qwen2_moe_shared", "qwen3_moe_dense_first"])
def test_cuda_backend_runs_moe_models_and_equals_hf(tmp_path, monkeypatch, name, graphs):
    # MoE models (Qwen2-MoE's shared expert; Qwen3-MoE with a dense first layer) through the CUDA
    # step path: the fused kernel, in graphs where asked (DecoderModel.graph_capturable), chunks.
    assert_greedy_equals_hf(name, tmp_path, monkeypatch, graphs, 5, (30, 7))
