"""rtp_llm.pd.kv_transfer on the CPU: a decode process reads a prefill process's KV blocks through
NIXL (its bundled UCX plugin, DRAM to DRAM). Each test runs a serving and a reading process
(spawned: NIXL's agents and threads stay out of pytest's process); the reader runs a check_*
function below and sends back its result or its traceback."""

import importlib
import multiprocessing as mp
import socket
import threading
import time
import traceback

import numpy as np
import pytest
import torch

from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2 as pb
from rtp_llm.pd.kv_transfer import KvTransferError, open_transfer


def _has_nixl() -> bool:
    for name in ("nixl_cu12._api", "nixl._api"):
        try:
            importlib.import_module(name)
            return True
        except ImportError:
            pass
    return False


if not _has_nixl():
    pytest.skip("NIXL is not installed (pip install nixl-cu12, deps/requirements_test.txt)", allow_module_level=True)

# K/V: [layers, 2, blocks, block_size, kv_heads, head_dim]; MLA: [layers, blocks, block_size, latent].
KV_SERVED = (3, 2, 20, 4, 2, 8)
KV_READER = (3, 2, 24, 4, 2, 8)   # the reader's pool may hold more blocks: only the layout must agree
MLA_SERVED, MLA_READER = (3, 20, 4, 16), (3, 22, 4, 16)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pool(shape, dtype, seed: int) -> torch.Tensor:
    """A pool with seeded random content, so that the reader can rebuild the server's."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _serve(shape, blocks_dim, dtype, port, sources, stop):
    transfer = open_transfer("nixl", _pool(shape, dtype, seed=1), blocks_dim, "127.0.0.1", port, "prefill")
    sources.put(transfer.source())
    stop.wait(60)
    transfer.close()


def _read(check, shape, blocks_dim, dtype, port, sources, results, served):
    try:
        pool = _pool(shape, dtype, seed=2)
        transfer = open_transfer("nixl", pool, blocks_dim, "127.0.0.1", port, "decode")
        source = sources.get(timeout=30) if served else None
        results.put(("ok", check(transfer, source, pool, blocks_dim, dtype)))
        transfer.close()
    except BaseException:
        results.put(("error", traceback.format_exc()))


def _run(check, served_shape, reader_shape, blocks_dim, dtype=torch.bfloat16, served=True):
    """Runs check(transfer, source, pool, blocks_dim, dtype) in a reading process, beside a process
    serving a pool of served_shape (none when not served): its return value."""
    ctx = mp.get_context("spawn")
    sources, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_read, args=(check, reader_shape, blocks_dim, dtype, _free_port(), sources,
                                             results, served))]
    if served:
        procs.append(ctx.Process(target=_serve, args=(served_shape, blocks_dim, dtype, _free_port(), sources, stop)))
    for p in procs:
        p.start()
    try:
        status, value = results.get(timeout=60)
    finally:
        stop.set()
        for p in procs:
            p.join(15)
            if p.is_alive():
                p.kill()
    if status != "ok":
        pytest.fail(f"the reading process failed:\n{value}")
    return value


def _block(pool, blocks_dim, b):
    """Block b in every region, as bytes (so that the comparison is exact for any dtype)."""
    return pool.select(blocks_dim, b).contiguous().view(torch.uint8)


def check_blocks_land(transfer, source, pool, blocks_dim, dtype):
    """Scattered, consecutive and mixed reads, also from several threads at once: each local target
    block then holds the source's block byte for byte, and every other block is untouched."""
    served = _pool(MLA_SERVED if blocks_dim == 1 else KV_SERVED, dtype, seed=1)
    before = pool.clone()
    reads = [([3, 17, 5, 0], [10, 2, 15, 7]),           # scattered
             ([6, 7, 8, 9], [11, 12, 13, 14]),          # one run on both sides
             ([19, 1, 2, 12], [0, 3, 4, 16])]           # a run on both sides (1, 2 -> 3, 4) and singles
    region_bytes = _block(pool, blocks_dim, 0).numel()
    for remote, local in reads:
        assert transfer.read(source, remote, local) == len(remote) * region_bytes
    threaded = [([4], [1]), ([10, 11], [5, 6]), ([13, 15], [8, 9]), ([16, 18], [17, 18])]
    errors = []

    def read(remote, local):
        try:
            transfer.read(source, remote, local, timeout_s=10)
        except Exception as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=read, args=pair) for pair in threaded]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    landed = {l: r for remote, local in reads + threaded for r, l in zip(remote, local)}
    for b in range(pool.shape[blocks_dim]):
        expected = _block(served, blocks_dim, landed[b]) if b in landed else _block(before, blocks_dim, b)
        assert torch.equal(_block(pool, blocks_dim, b), expected), f"local block {b}"
    return len(landed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kv_blocks_read_across_processes(dtype):
    assert _run(check_blocks_land, KV_SERVED, KV_READER, 2, dtype) == 19


def test_mla_blocks_read_across_processes():
    assert _run(check_blocks_land, MLA_SERVED, MLA_READER, 1) == 19


def check_refused(transfer, source, pool, blocks_dim, dtype):
    """Reads that must be refused, each with its message; then a good read still works."""
    messages = []
    for remote, local in [([1, 2], [1]), ([1], [24]), ([1], [-1]), ([-3], [1]), ([1, 2], [5, 5]),
                          ([20], [1])]:  # the server holds 20 blocks: NIXL refuses block 20
        with pytest.raises(KvTransferError) as e:
            transfer.read(source, remote, local, timeout_s=5)
        messages.append(str(e.value))
    with pytest.raises(KvTransferError):
        transfer.read(b"\xff not a proto", [1], [1])
    assert transfer.read(source, [], []) == 0
    assert transfer.read(source, [19], [23]) > 0
    return messages


def test_bad_block_ids_are_refused():
    messages = _run(check_refused, KV_SERVED, KV_READER, 2)
    assert "2 remote blocks but 1 local blocks" in messages[0]
    assert "local block id 24 is out of range [0, 24)" in messages[1]
    assert "local block id -1" in messages[2] and "remote block id -3" in messages[3]
    assert "given twice" in messages[4]
    assert "refused by NIXL" in messages[5]


def check_layout_refused(transfer, source, pool, blocks_dim, dtype):
    with pytest.raises(KvTransferError) as e:
        transfer.read(source, [1], [1])
    return str(e.value)


def test_a_layout_mismatch_names_both_layouts():
    message = _run(check_layout_refused, KV_SERVED, (3, 2, 24, 4, 4, 8), 2)
    assert "'3x2xNx4x2x8:bfloat16'" in message and "'3x2xNx4x4x8:bfloat16'" in message


def check_unreachable(transfer, source, pool, blocks_dim, dtype):
    """A source naming a port nobody listens on: refused within the timeout, naming the peer."""
    mine = pb.KvSourcePB.FromString(transfer.source())
    mine.agent, mine.address = "ghost", f"127.0.0.1:{_free_port()}"
    start = time.monotonic()
    with pytest.raises(KvTransferError) as e:
        transfer.read(mine.SerializeToString(), [1], [2], timeout_s=2.0)
    return time.monotonic() - start, str(e.value)


def test_an_unreachable_peer_fails_within_the_timeout():
    elapsed, message = _run(check_unreachable, None, KV_READER, 2, served=False)
    assert 1.9 <= elapsed < 4.0
    assert "'ghost'" in message and "127.0.0.1:" in message


def check_source(transfer, source, pool, blocks_dim, dtype):
    src = pb.KvSourcePB.FromString(transfer.source())
    assert src.region_addrs[0] == pool.data_ptr()
    return src.SerializeToString()


def test_the_source_describes_the_pool():
    """source(): engine, agent, address, memory, layout, and one region per layer and K/V."""
    src = pb.KvSourcePB.FromString(_run(check_source, None, KV_READER, 2, served=False))
    assert (src.engine, src.agent, src.memory, src.device_id) == ("nixl", "decode", "DRAM", 0)
    assert src.address.startswith("127.0.0.1:") and src.layout == "3x2xNx4x2x8:bfloat16"
    block_bytes = 4 * 2 * 8 * 2
    assert src.block_bytes == block_bytes and len(src.region_addrs) == 6
    assert all(b - a == 24 * block_bytes for a, b in zip(src.region_addrs, src.region_addrs[1:]))


def check_ucx_settings(transfer, source, pool, blocks_dim, dtype):
    import os
    return os.environ.get("UCX_CUDA_IPC_ENABLE_GET_ZCOPY")


def test_cuda_ipc_reads_are_on_unless_the_user_says_otherwise(monkeypatch):
    """UCX turns cuda_ipc reads off without NVLink, and device memory then crawls through TCP (0.5
    GB/s on one H200, docs/benchmarks.md): the transfer turns them on, and keeps a user's choice."""
    monkeypatch.delenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", raising=False)
    assert _run(check_ucx_settings, None, KV_READER, 2, served=False) == "y"
    monkeypatch.setenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "n")
    assert _run(check_ucx_settings, None, KV_READER, 2, served=False) == "n"


def test_an_unknown_engine_names_the_supported_ones():
    with pytest.raises(KvTransferError, match="'mooncake'.*supported: nixl"):
        open_transfer("mooncake", torch.zeros(2, 2, 3, 4), 2, "127.0.0.1", 1, "x")


def test_descriptors_cover_runs_consecutive_on_both_sides():
    """One descriptor per region per run: a run needs consecutive ids on both sides."""
    from rtp_llm.pd.kv_transfer import _runs
    remote, local, lengths = _runs(np.array([3, 4, 5, 9, 10, 11, 2]), np.array([0, 1, 2, 7, 8, 20, 21]))
    assert (remote.tolist(), local.tolist(), lengths.tolist()) == ([3, 9, 11, 2], [0, 7, 20, 21], [3, 2, 1, 1])
