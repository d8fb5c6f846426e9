"""Tensor parallelism (Megatron-style) over torch.distributed, with the device's collectives
(DeviceBackend.dist_backend; step batches always go over the host's).

Each rank holds a shard of every layer: its H / tp query heads and their KV heads (split when
there are at least tp KV heads, else the one KV head its query heads share, replicated), a
slice of the MLP's intermediate dimension, and a vocab slice of the embedding and LM head.
Column-parallel projections (QKV, gate/up) need no communication; row-parallel ones (attention
output, down) produce partial sums that an all-reduce completes; the embedding lookup is an
all-reduce of masked local lookups, the logits an all-gather of vocab slices. A device may bring
a faster all-reduce for the small tensors of decode steps (DeviceBackend.small_all_reduce, e.g.
symmetric memory on GPUs): the row-parallel projections then write their partial sums straight
into its send buffer (send_buffer), and it may fuse the residual add and RMSNorm that follow
(all_reduce_add_rms_norm).

Rank 0 owns the C++ core and samples; every step it broadcasts the step batch (StepBroadcast)
and all ranks run the model on it. Collectives time out (--dist_timeout_s) so that a dead rank
stops the others with an error instead of a hang."""

import datetime
import logging
import socket
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from rtp_llm.config.parallel_config import ParallelConfig  # noqa: F401  (importers take it from here too)
from rtp_llm.device import backend_class
from rtp_llm.device.base import HOST_DIST_BACKEND

log = logging.getLogger(__name__)


class CollectiveError(RuntimeError):
    """A collective failed or timed out: a rank is gone and the group is unusable. Fatal: the
    engine stops rather than fail request after request (gloo reports a dead peer as a plain
    RuntimeError, NCCL and timeouts as torch.distributed.DistError)."""


def _collective(what: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, dist.DistError) as e:
        raise CollectiveError(f"tensor-parallel {what} failed ({type(e).__name__}: {e}); a rank died or hung "
                              f"past --dist_timeout_s") from e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TPShard:
    """This rank's place in the tensor-parallel group (size 1: no group, no communication)."""

    rank: int = 0
    size: int = 1
    group: Any = None       # the model's collectives (the device's DeviceBackend.dist_backend)
    cpu_group: Any = None   # step-batch broadcasts (always the host's backend: host arrays)
    one_shot: Any = None    # small all-reduces, from the device's SmallAllReduce (None: all through group)
    timeout_s: float = 0.0  # --dist_timeout_s: a step waiting longer on the device means a rank is gone

    def heads(self, num_heads: int, num_kv_heads: int) -> Tuple[int, int, int, int]:
        """(first query head, query heads, first KV head, KV heads) of this rank."""
        if num_heads % self.size:
            raise ValueError(f"--tp_size {self.size} must divide num_attention_heads ({num_heads})")
        hq = num_heads // self.size
        if num_kv_heads >= self.size:
            if num_kv_heads % self.size:
                raise ValueError(f"--tp_size {self.size} must divide num_key_value_heads ({num_kv_heads}) or be a "
                                 f"multiple of it")
            hk = num_kv_heads // self.size
            return self.rank * hq, hq, self.rank * hk, hk
        if self.size % num_kv_heads:
            raise ValueError(f"--tp_size {self.size} must divide num_key_value_heads ({num_kv_heads}) or be a "
                             f"multiple of it")
        # Fewer KV heads than ranks: this rank's query heads all use one KV head, replicated.
        return self.rank * hq, hq, (self.rank * hq) // (num_heads // num_kv_heads), 1

    def split(self, n: int, what: str) -> Tuple[int, int]:
        if n % self.size:
            raise ValueError(f"--tp_size {self.size} must divide {what} ({n})")
        return self.rank * (n // self.size), n // self.size

    def vocab(self, vocab_size: int) -> Tuple[int, int]:
        """(first id, rows): equal slices of ceil(V / tp) rows (the last one zero-padded)."""
        per = -(-vocab_size // self.size)
        return self.rank * per, per

    def min_over_ranks(self, n: int) -> int:
        if self.size == 1:
            return int(n)
        t = torch.tensor([int(n)], dtype=torch.int64)
        _collective("all_reduce", dist.all_reduce, t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the ranks: x itself, reduced in place, unless x is the send buffer."""
        if self.size == 1:
            return x
        if self.one_shot is not None:
            y = self.one_shot(x)
            if y is not None:
                return y
        _collective("all_reduce", dist.all_reduce, x, group=self.group)
        return x

    def send_buffer(self, rows: int, cols: int, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """Where a row-parallel projection should write its [rows, cols] partial sum (the
        all-reduce then starts without a copy); None: anywhere."""
        if self.size == 1 or self.one_shot is None:
            return None
        return self.one_shot.send_buffer((rows, cols), dtype)

    def all_reduce_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                backend) -> torch.Tensor:
        """residual += all_reduce(x); returns backend.rms_norm(residual) (one kernel where the
        device's small all-reduce fuses them, for decode-sized x)."""
        if self.size > 1 and self.one_shot is not None:
            y = self.one_shot.add_rms_norm(x, residual, weight, eps)
            if y is not None:
                return y
        return backend.add_rms_norm(self.all_reduce(x), residual, weight, eps)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` into every rank's `x` (same shape and dtype), on the device stream."""
        if self.size > 1:
            _collective("broadcast", dist.broadcast, x, src=0, group=self.group)
        return x

    def gather_vocab(self, local: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[N, V / tp] slices of every rank -> [N, V]."""
        if self.size == 1:
            return local
        parts = [torch.empty_like(local) for _ in range(self.size)]
        _collective("all_gather", dist.all_gather, parts, local.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)[:, :vocab_size]


def init_tensor_parallel(config: ParallelConfig, device: torch.device) -> TPShard:
    """Joins the process group (TCP rendezvous at master_addr:master_port) with the collectives
    of `device`'s backend."""
    config.validate()
    if config.tp_size == 1:
        return TPShard()
    timeout = datetime.timedelta(seconds=config.dist_timeout_s)
    policy = backend_class(device.type)
    policy.prepare_distributed()
    dist.init_process_group(policy.dist_backend, init_method=f"tcp://{config.master_addr}:{config.master_port}",
                            rank=config.world_rank, world_size=config.world_size, timeout=timeout)
    host_group = (dist.new_group(backend=HOST_DIST_BACKEND, timeout=timeout)
                  if policy.dist_backend != HOST_DIST_BACKEND else dist.group.WORLD)
    shard = TPShard(config.world_rank, config.tp_size, dist.group.WORLD, host_group, None, config.dist_timeout_s)
    shard.one_shot = _agree_on_small_all_reduce(shard, policy.small_all_reduce(), device, policy.dist_backend)
    return shard


def _agree_on_small_all_reduce(shard: TPShard, factory, device: torch.device, fallback: str):
    """The device's small all-reduce where every rank has one, else None: ranks in different
    kernels (the fallback's, the small one's, its fused one) would wait on each other forever."""
    if not shard.min_over_ranks(factory is not None and factory.available()):
        if factory is not None:
            log.info("%s not used: not available on every rank (one had a tensor-parallel group in this process "
                     "before); using %s", factory.name, fallback)
        return None
    try:
        one_shot = factory.create(dist.group.WORLD, device)
    except Exception as e:  # e.g. no peer access between the devices: the fallback does it all
        log.warning("%s unavailable (%s: %s); using %s", factory.name, type(e).__name__, e, fallback)
        one_shot = None
    if not shard.min_over_ranks(one_shot is not None):
        return None
    if not shard.min_over_ranks(one_shot.fused):
        one_shot.fused = False
    return one_shot


# ------------------------------------------------------------------ step batch broadcast

class StepBroadcast:
    """Rank 0 sends each step batch's counts and MODEL arrays (the ones every rank's model path
    reads: rtp_llm/cpp/engine/step_batch_fields.h), bit-exact; the other ranks receive them
    (None: stop)."""

    def __init__(self, shard: TPShard):
        from rtp_llm.ops.engine_core import GROUP_MODEL, SCALAR, step_batch_fields

        self.shard = shard
        fields = step_batch_fields()
        self._counts = [f.name for f in fields if f.length == SCALAR]
        self._arrays = [f for f in fields if f.group == GROUP_MODEL]

    def _bcast(self, t: torch.Tensor) -> torch.Tensor:
        _collective("step broadcast", dist.broadcast, t, src=0, group=self.shard.cpu_group)
        return t

    def send(self, b) -> None:
        self._bcast(torch.tensor([getattr(b, n) for n in self._counts], dtype=torch.int32))
        payload = np.concatenate([np.ascontiguousarray(getattr(b, f.name)).reshape(-1).view(np.uint8)
                                  for f in self._arrays])
        self._bcast(torch.from_numpy(payload))

    def send_stop(self) -> None:
        self._bcast(torch.full((len(self._counts),), -1, dtype=torch.int32))

    def recv(self) -> Optional[SimpleNamespace]:
        from rtp_llm.ops.engine_core import used_lengths

        header = self._bcast(torch.empty(len(self._counts), dtype=torch.int32))
        b = SimpleNamespace(**{n: int(v) for n, v in zip(self._counts, header)})
        if b.num_streams < 0:
            return None
        used = used_lengths(b)
        sizes = [used[f.length] * f.dtype.itemsize for f in self._arrays]
        flat = self._bcast(torch.empty(sum(sizes), dtype=torch.uint8)).numpy()
        off = 0
        for f, n in zip(self._arrays, sizes):
            setattr(b, f.name, flat[off:off + n].view(f.dtype).copy())  # (copied: aligned, as the core's)
            off += n
        b.block_tables = b.block_tables.reshape(b.num_streams, b.block_table_stride)
        return b
