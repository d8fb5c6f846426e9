"""Reading another engine process's KV cache blocks into ours through a transfer engine (NIXL;
Mooncake could follow behind the same KvTransfer interface), for prefill/decode disaggregation.

Invariants:
- A pool is one contiguous tensor; its `blocks_dim` dimension (num_blocks) splits it into
  R = prod(shape[:blocks_dim]) regions of num_blocks blocks, and block b of region r is the
  block_bytes bytes at data_ptr + (r * num_blocks + b) * block_bytes.
- Two pools exchange blocks only when their layouts (the shape with the blocks dimension written
  "N", and the dtype) are equal: then R and block_bytes agree and a block means the same bytes on
  both sides. num_blocks may differ, so a remote id's upper bound is checked by the engine against
  the peer's registered memory, not here.
- A source (serialized KvSourcePB) is all a reader needs to know of the peer besides the engine.
- read() returns once every byte has landed, or raises KvTransferError; after a raise the local
  target blocks hold unspecified bytes.
- The pool tensor is registered by address: a KvTransfer holds a reference to it until close().
- read() may run on several threads at once; close() comes after the last read.
"""

import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np
import torch

from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2 as pb

ENGINES = ("nixl",)


class KvTransferError(Exception):
    """A read that cannot be (or was not) done; the message says why."""


class KvTransfer(ABC):
    """One process's KV pool, exposed to peers and able to read theirs."""

    @abstractmethod
    def source(self) -> bytes:
        """A serialized KvSourcePB: how a peer reads this pool."""

    @abstractmethod
    def read(self, source: bytes, remote_blocks: Sequence[int], local_blocks: Sequence[int],
             timeout_s: float = 30.0) -> int:
        """Copies the source's block remote_blocks[i] into local block local_blocks[i] in every
        region; blocks until done and returns the bytes moved."""

    @abstractmethod
    def close(self) -> None:
        """Stops serving and reading; the pool tensor may be freed afterwards."""


class _Pool:
    """The pool tensor's geometry (the invariants above), computed once."""

    def __init__(self, cache: torch.Tensor, blocks_dim: int):
        if not 0 <= blocks_dim < cache.dim():
            raise KvTransferError(f"blocks_dim {blocks_dim} is not a dimension of a {cache.dim()}-d pool")
        if not cache.is_contiguous():
            raise KvTransferError("the KV pool must be one contiguous tensor (blocks are found by address)")
        shape = list(cache.shape)
        self.num_blocks = shape[blocks_dim]
        self.block_bytes = int(np.prod(shape[blocks_dim + 1:], dtype=np.int64)) * cache.element_size()
        num_regions = int(np.prod(shape[:blocks_dim], dtype=np.int64))
        self.region_addrs = [cache.data_ptr() + r * self.num_blocks * self.block_bytes for r in range(num_regions)]
        dims = ["N" if d == blocks_dim else str(n) for d, n in enumerate(shape)]
        self.layout = "x".join(dims) + ":" + str(cache.dtype).removeprefix("torch.")
        self.memory = "DRAM" if cache.device.type == "cpu" else "VRAM"
        self.device_id = cache.device.index or 0  # NIXL calls host memory device 0


def _parse_source(source: bytes, engine: str, pool: _Pool) -> pb.KvSourcePB:
    """The peer's KvSourcePB, refused unless it is for this engine and this pool's layout."""
    try:
        src = pb.KvSourcePB.FromString(source)
    except Exception as e:  # protobuf's DecodeError
        raise KvTransferError(f"the KV source is not a KvSourcePB: {e}") from e
    if src.engine != engine:
        raise KvTransferError(f"the KV source is for engine {src.engine!r}, this transfer is {engine!r}")
    if src.layout != pool.layout:
        raise KvTransferError(f"KV layouts differ: the source's is {src.layout!r}, ours is {pool.layout!r}")
    # Equal layouts imply these; a source that disagrees with its own layout is malformed.
    if len(src.region_addrs) != len(pool.region_addrs) or src.block_bytes != pool.block_bytes:
        raise KvTransferError(f"the KV source ({len(src.region_addrs)} regions of {src.block_bytes}-byte "
                              f"blocks) contradicts its layout {src.layout!r}")
    return src


def _check_blocks(remote_blocks, local_blocks, num_blocks: int):
    """The ids as int64 arrays, refused unless they pair up and the local ones are in range and
    distinct (one transfer writing a block twice would leave either copy)."""
    remote = np.asarray(remote_blocks, dtype=np.int64).reshape(-1)
    local = np.asarray(local_blocks, dtype=np.int64).reshape(-1)
    if len(remote) != len(local):
        raise KvTransferError(f"{len(remote)} remote blocks but {len(local)} local blocks")
    bad = local[(local < 0) | (local >= num_blocks)]
    if len(bad):
        raise KvTransferError(f"local block id {int(bad[0])} is out of range [0, {num_blocks})")
    if len(remote) and remote.min() < 0:
        raise KvTransferError(f"remote block id {int(remote.min())} is negative")
    if len(np.unique(local)) != len(local):
        raise KvTransferError("a local block id is given twice")
    return remote, local


def _runs(remote: np.ndarray, local: np.ndarray):
    """(remote start, local start, length) of each maximal run where both ids step by one: one
    descriptor per region per run instead of per block (8192 tokens of 16-token blocks over 56
    regions would be 28k descriptors)."""
    breaks = np.flatnonzero((np.diff(remote) != 1) | (np.diff(local) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [len(remote)])))
    return remote[starts], local[starts], lengths


def _descriptors(region_addrs, starts, lengths, block_bytes: int, device_id: int) -> np.ndarray:
    """NIXL's Nx3 (address, length, device) rows, region-major; both sides built in the same order
    so that row i of one pairs with row i of the other. All uint64: numpy would turn a mix of
    uint64 and int64 into float64 and lose address bits."""
    bases = np.asarray(region_addrs, dtype=np.uint64)[:, None]
    bb = np.uint64(block_bytes)
    addrs = bases + starts.astype(np.uint64)[None, :] * bb
    lens = np.broadcast_to(lengths.astype(np.uint64) * bb, addrs.shape)
    return np.stack([addrs.reshape(-1), lens.reshape(-1), np.full(addrs.size, device_id, np.uint64)], axis=1)


def _import_nixl():
    """NIXL's Python API: the build for torch's CUDA major first (its UCX reaches that CUDA's
    device memory), then any; only one need be installed (the `nixl` meta package pulls in the
    cu12 and the cu13 builds)."""
    import importlib

    major = torch.version.cuda.split(".")[0] if torch.version.cuda else None
    names = ([f"nixl_cu{major}"] if major else []) + ["nixl_cu12", "nixl_cu13", "nixl"]
    for name in names:
        try:
            api = importlib.import_module(f"{name}._api")
            break
        except ImportError:
            continue
    else:
        raise KvTransferError("the NIXL KV transfer needs NIXL: pip install nixl-cu12 (nixl-cu13 with CUDA 13)")
    # NIXL logs every agent's creation at INFO on stdout; ours says what matters once (quiet by default).
    logging.getLogger("nixl").setLevel(logging.WARNING)
    return api


PROGRESS_DELAY_US = 100  # NIXL's progress thread pauses this long between polls


# UCX's settings for reading device memory, unless the user set them. UCX turns cuda_ipc's reads
# (get zcopy) off on a GPU without NVLink, assuming slow PCIe peers; a read between two processes on
# one GPU, or between PCIe peers, then falls back to staging through host memory over TCP loopback
# (docs/benchmarks.md: ~0.5 GB/s against a device copy's hundreds).
UCX_DEFAULTS = {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}


def _paced_agent(api, name: str, config):
    """nixl_agent(name, config) whose progress thread pauses PROGRESS_DELAY_US between polls.
    NIXL's Python wrapper sets no pause, so every agent keeps a core busy even when idle (1.9 s of
    CPU in 2 s here; 0.06 s paced): the wrapper has no option for it, so its binding's config
    class is swapped, for this call only, for one that keeps the pause."""
    base = api.nixlBind.nixlAgentConfig
    delay = base.__dict__["pthrDelay"]

    class Paced(base):
        pthrDelay = property(delay.__get__, lambda self, v: delay.__set__(self, max(v, PROGRESS_DELAY_US)))

    api.nixlBind.nixlAgentConfig = Paced
    try:
        return api.nixl_agent(name, config)
    finally:
        api.nixlBind.nixlAgentConfig = base


class NixlTransfer(KvTransfer):
    """The pool registered with one NIXL agent (UCX backend) whose listen thread serves its
    metadata on `port`; peers' metadata is fetched on first read and cached by agent name."""

    POLL_S = 0.0002       # between checks of a transfer's state (UCX progresses on its own thread)
    REFETCH_S = 1.0       # a metadata request a peer missed (not listening yet) is sent again

    def __init__(self, cache: torch.Tensor, blocks_dim: int, host: str, port: int, name: str):
        if not 0 < port < 65536:
            raise KvTransferError(f"port {port}: NIXL's metadata listener needs a fixed port to advertise")
        self._pool = _Pool(cache, blocks_dim)
        self._cache = cache  # registered by address: freeing it would let peers read reused memory
        self._name, self._address = name, f"{host}:{port}"
        api = _import_nixl()
        for key, value in UCX_DEFAULTS.items():  # read by UCX when the agent makes its context
            os.environ.setdefault(key, value)
        try:
            # The listen thread also sends our metadata requests: a reader needs one too. The
            # progress thread must run on the side being read, else UCX's connection setup stalls
            # (paced: _paced_agent).
            config = api.nixl_agent_config(enable_prog_thread=True, enable_listen_thread=True,
                                           listen_port=port, backends=["UCX"])
            self._agent = _paced_agent(api, name, config)
            self._registration = self._agent.register_memory(cache)
        except Exception as e:  # RuntimeError when the port is taken; nixl errors otherwise
            raise KvTransferError(f"NIXL agent {name!r} on port {port}: {e}") from e
        if "UCX" not in self._agent.backends:
            raise KvTransferError("NIXL has no UCX plugin (its wheel bundles one: reinstall nixl-cu12)")
        # NIXL's agent serializes its own calls (strict sync mode, on with the listen thread); this
        # lock keeps our peer table consistent with the agent's and orders create/post/release.
        self._lock = threading.Lock()
        self._peers: dict[str, str] = {}                   # agent name -> address, metadata loaded
        self._fetching: dict[str, threading.Lock] = {}     # one fetch per peer at a time
        self._closed = False

    def source(self) -> bytes:
        pool = self._pool
        return pb.KvSourcePB(engine="nixl", agent=self._name, address=self._address, memory=pool.memory,
                             device_id=pool.device_id, region_addrs=pool.region_addrs,
                             block_bytes=pool.block_bytes, layout=pool.layout).SerializeToString()

    def read(self, source: bytes, remote_blocks: Sequence[int], local_blocks: Sequence[int],
             timeout_s: float = 30.0) -> int:
        deadline = time.monotonic() + timeout_s
        if self._closed:
            raise KvTransferError("the KV transfer is closed")
        src = _parse_source(source, "nixl", self._pool)
        remote, local = _check_blocks(remote_blocks, local_blocks, self._pool.num_blocks)
        if not len(remote):
            return 0
        self._connect(src.agent, src.address, deadline)
        r_start, l_start, lengths = _runs(remote, local)
        bb = self._pool.block_bytes
        rows_remote = _descriptors(src.region_addrs, r_start, lengths, bb, src.device_id)
        rows_local = _descriptors(self._pool.region_addrs, l_start, lengths, bb, self._pool.device_id)
        try:
            self._transfer(src, rows_remote, rows_local, deadline, timeout_s)
        except KvTransferError:
            with self._lock:  # a restarted peer keeps its name but not its memory keys: refetch
                self._forget_locked(src.agent)
            raise
        return len(remote) * len(self._pool.region_addrs) * bb

    def _connect(self, agent: str, address: str, deadline: float) -> None:
        """Loads the peer's metadata unless loaded from this address already; waits at most until
        the deadline. A per-peer lock, so that an unreachable peer stalls only its own readers."""
        if agent == self._name:
            return  # NIXL reads its own agent's memory by its own name (loopback)
        with self._lock:
            if self._peers.get(agent) == address:
                return
            fetch_lock = self._fetching.setdefault(agent, threading.Lock())
        if not fetch_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise KvTransferError(f"KV peer {agent!r} at {address}: not reachable in time (another read waits on it)")
        try:
            with self._lock:
                if self._peers.get(agent) == address:
                    return
                if agent in self._peers:  # moved: its old metadata is stale
                    self._forget_locked(agent)
            self._fetch(agent, address, deadline)
            with self._lock:
                self._peers[agent] = address
        finally:
            fetch_lock.release()

    def _fetch(self, agent: str, address: str, deadline: float) -> None:
        """Asks the peer's listener for its metadata and polls until NIXL has loaded it. A refused
        connection is only logged by NIXL, never reported: the deadline is the error."""
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise KvTransferError(f"KV peer {agent!r}: address {address!r} is not host:port")
        next_ask = 0.0
        while True:
            now = time.monotonic()
            with self._lock:
                if now >= next_ask:
                    self._agent.fetch_remote_metadata(agent, host, int(port))
                    next_ask = now + self.REFETCH_S
                if self._agent.check_remote_metadata(agent):
                    return
            if now >= deadline:
                raise KvTransferError(f"KV peer {agent!r} at {address}: no metadata within the timeout "
                                      "(unreachable, not listening, or serving another agent name)")
            time.sleep(0.005)

    def _transfer(self, src, rows_remote, rows_local, deadline: float, timeout_s: float) -> None:
        """One NIXL READ of all rows; waits for it outside the lock so that reads overlap."""
        nbytes = int(rows_local[:, 1].sum())
        try:
            with self._lock:
                local = self._agent.get_xfer_descs(rows_local, self._pool.memory)
                remote = self._agent.get_xfer_descs(rows_remote, src.memory)
                handle = self._agent.initialize_xfer("READ", local, remote, src.agent)
                state = self._agent.transfer(handle)
        except Exception as e:  # nixlNotFoundError: a remote block beyond the peer's registered pool
            raise KvTransferError(f"KV read of {nbytes} bytes from {src.agent!r} refused by NIXL: "
                                  f"{type(e).__name__} {e} (a remote block id out of range?)") from e
        try:
            while state == "PROC" and time.monotonic() < deadline:
                time.sleep(self.POLL_S)
                state = self._agent.check_xfer_state(handle)
        except Exception as e:  # nixlRemoteDisconnectError and the like
            state = f"{type(e).__name__} {e}"
        try:
            with self._lock:
                self._agent.release_xfer_handle(handle)  # cancels one still in flight, or raises
        except Exception as e:
            raise KvTransferError(f"a KV read from {src.agent!r} could not be cancelled ({e}): its local "
                                  "blocks may still be written") from e
        if state == "PROC":
            raise KvTransferError(f"KV read of {nbytes} bytes from {src.agent!r} not done in {timeout_s} s")
        if state != "DONE":
            raise KvTransferError(f"KV read of {nbytes} bytes from {src.agent!r} failed: {state}")

    def _forget_locked(self, agent: str) -> None:
        if self._peers.pop(agent, None) is not None:
            try:
                self._agent.remove_remote_agent(agent)
            except Exception:
                pass  # unknown to NIXL already: nothing to drop

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for agent in list(self._peers):
                self._forget_locked(agent)
            self._agent.deregister_memory(self._registration)
            # The listen and progress threads stop, and the port is freed, with the agent.
            del self._agent, self._cache


def open_transfer(engine: str, cache: torch.Tensor, blocks_dim: int, host: str, port: int,
                  name: str) -> KvTransfer:
    """The KvTransfer of the named engine for this pool."""
    if engine == "nixl":
        return NixlTransfer(cache, blocks_dim, host, port, name)
    raise KvTransferError(f"unknown KV transfer engine {engine!r}; supported: {', '.join(ENGINES)}")
