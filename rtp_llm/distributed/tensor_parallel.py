"""Tensor parallelism (Megatron-style) over torch.distributed: NCCL on GPUs, gloo on the CPU.

Each rank holds a shard of every layer: its H / tp query heads and their KV heads (split when
there are at least tp KV heads, else the one KV head its query heads share, replicated), a
slice of the MLP's intermediate dimension, and a vocab slice of the embedding and LM head.
Column-parallel projections (QKV, gate/up) need no communication; row-parallel ones (attention
output, down) produce partial sums that an all-reduce completes; the embedding lookup is an
all-reduce of masked local lookups, the logits an all-gather of vocab slices. On GPUs the
small all-reduces of decode steps (a few KB per layer) go through symmetric memory
(rtp_llm.device.cuda.all_reduce): the row-parallel projections write their partial sums
straight into the symmetric buffer (send_buffer) and one kernel stores them into the peers'
receive buffers, sums what the peers stored into its own, and applies the residual add and
RMSNorm that follow (all_reduce_add_rms_norm); NCCL's ring takes several times its latency at
those sizes.

Rank 0 owns the C++ core and samples; every step it broadcasts the step batch (StepBroadcast)
and all ranks run the model on it. Collectives time out (--dist_timeout_s) so that a dead rank
stops the others with an error instead of a hang."""

import datetime
import logging
import os
import socket
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist


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


@dataclass
class ParallelConfig:
    """Upstream's flags (each with an upper-case env twin)."""

    tp_size: int = 1
    world_size: int = 1
    world_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0            # 0: pick a free one (single-node launches)
    dist_timeout_s: int = 120

    def validate(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"--tp_size must be >= 1, got {self.tp_size}")
        if self.world_size != self.tp_size:
            raise ValueError(f"--world_size ({self.world_size}) must equal --tp_size ({self.tp_size}): only tensor "
                             f"parallelism is supported")
        if not 0 <= self.world_rank < self.world_size:
            raise ValueError(f"--world_rank must be in [0, {self.world_size}), got {self.world_rank}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TPShard:
    """This rank's place in the tensor-parallel group (size 1: no group, no communication)."""

    rank: int = 0
    size: int = 1
    group: Any = None       # the model's collectives (NCCL on GPUs, gloo on the CPU)
    cpu_group: Any = None   # step-batch broadcasts (always gloo: host arrays)
    one_shot: Any = None    # rtp_llm.device.cuda.all_reduce.OneShotAllReduce: small all-reduces on GPUs
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
        """residual += all_reduce(x); returns backend.rms_norm(residual) (one kernel on GPUs
        for decode-sized x)."""
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


_symm_mem_used = [False]  # this process rendezvoused symmetric memory for a group already


def init_tensor_parallel(config: ParallelConfig, device: torch.device) -> TPShard:
    """Joins the process group (TCP rendezvous at master_addr:master_port)."""
    config.validate()
    if config.tp_size == 1:
        return TPShard()
    timeout = datetime.timedelta(seconds=config.dist_timeout_s)
    backend = "nccl" if device.type == "cuda" else "gloo"
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (shared machines)
    dist.init_process_group(backend, init_method=f"tcp://{config.master_addr}:{config.master_port}",
                            rank=config.world_rank, world_size=config.world_size, timeout=timeout)
    cpu_group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    shard = TPShard(config.world_rank, config.tp_size, dist.group.WORLD, cpu_group, None, config.dist_timeout_s)
    one_shot = None
    want = device.type == "cuda" and os.environ.get("RTP_LLM_ONE_SHOT_ALL_REDUCE", "1") != "0"
    # torch numbers symmetric-memory rendezvous per process, so ranks of a second group in a
    # process that already had one would wait on keys the others never write: all or none.
    if shard.min_over_ranks(want and not _symm_mem_used[0]):
        _symm_mem_used[0] = True
        try:
            from rtp_llm.device.cuda.all_reduce import OneShotAllReduce

            one_shot = OneShotAllReduce(dist.group.WORLD, device)
        except Exception as e:  # e.g. no peer access between the GPUs: NCCL does it all
            log.warning("symmetric-memory all-reduce unavailable (%s: %s); using NCCL", type(e).__name__, e)
        # Every rank or none, for the one-shot kernel and for the fused one: ranks in different
        # kernels (NCCL, torch's one-shot, the fused one) would wait on each other forever.
        if not shard.min_over_ranks(one_shot is not None):
            one_shot = None
        elif not shard.min_over_ranks(one_shot.fused):
            one_shot.fused = False
    elif want:
        log.info("symmetric-memory all-reduce not used: this process had a tensor-parallel group before; using NCCL")
    shard.one_shot = one_shot
    return shard


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
