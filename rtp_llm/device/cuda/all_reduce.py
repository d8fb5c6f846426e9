"""Small all-reduces of tensor parallelism on GPUs through symmetric memory (NVLink peer
access, no multicast/NVLS).

- OneShotAllReduce.__call__: torch's symm_mem.one_shot_all_reduce (every rank's partial sum in
  its own symmetric buffer, copied there first unless the producer wrote there:
  send_buffer(); one kernel reads all ranks' buffers).
- OneShotAllReduce.add_rms_norm: the decoder's `residual += all_reduce(x); rms_norm(residual)`
  in one Triton kernel that crosses NVLink once: each rank stores its rows straight into the
  peers' receive buffers and polls its own for theirs (the data is its own flag), then adds
  and normalizes. One launch instead of three (copy, all-reduce, add + norm), and no barrier.
"""

import math
import os
from typing import Optional

import torch
import triton
import triton.language as tl

from rtp_llm.device.base import SmallAllReduce
from rtp_llm.device.cuda.kernels.launch import launch_options, pdl_enter
from rtp_llm.device.cuda.kernels.row_ops import weighted_rms_norm


@triton.jit
def _push_poll_add_rms_norm_kernel(send_ptr, recv_ptrs_ptr, state_ptr, res_ptr, w_ptr, out_ptr, D, CAP, stride_res,
                                   stride_out, eps, RANK: tl.constexpr, WS: tl.constexpr, BITS: tl.constexpr,
                                   BLOCK: tl.constexpr, PDL: tl.constexpr):
    """One token row, one NVLink crossing: the row of this rank's partial sum (send_ptr, local)
    is stored straight into every peer's receive buffer, then the peers' rows are polled for in
    this rank's own receive buffer; the sum over ranks (fp32, rank order: the same bits on every
    rank, and NCCL's values for two ranks, a zero's sign aside), residual += sum,
    out = rms_norm(residual) * weight.

    The data is its own flag (Lamport): a receive buffer holds the sentinel -0.0 wherever no
    row is pending, senders write -0.0 as +0.0 (equal in value), and the reader, once every
    element of a peer's row differs from the sentinel, stores the sentinel back. Receive
    buffers are [2 slots][WS senders][CAP elements] and every call flips the slot (state[0],
    read by every program, flipped by the last to arrive, counted in state[1]). A peer writes
    a slot again only two calls later, after it has seen this rank's row of the call between,
    which this rank sends only after this call has finished, resets included: no barrier is
    needed for reuse, and the buffers replay in CUDA graphs."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < D
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)  # never written by a kernel
    pdl_enter(PDL)
    if BITS == 16:
        it = tl.int16
        SENT: tl.constexpr = -32768  # bits of -0.0 in bf16 / fp16
    else:
        it = tl.int32
        SENT: tl.constexpr = -2147483648  # -0.0 in fp32
    dt = res_ptr.dtype.element_ty
    mine = tl.load(send_ptr + row * D + cols, mask=m, other=0.0)
    r = tl.load(res_ptr + row * stride_res + cols, mask=m, other=0.0)  # in flight while the peers' rows come
    epoch = tl.load(state_ptr, cache_modifier=".cg")
    bits = mine.to(it, bitcast=True)
    bits = tl.where(bits == SENT, tl.zeros_like(bits), bits)
    recvs = recv_ptrs_ptr.to(tl.pointer_type(tl.uint64))
    slot = (epoch & 1) * WS
    for p in tl.static_range(WS):
        if p != RANK:
            peer = tl.multiple_of(tl.load(recvs + p).to(tl.pointer_type(it)), 16)  # symm_mem: page-aligned
            tl.store(peer + (slot + RANK) * CAP + row * D + cols, bits, mask=m)
    # Every thread's epoch load is done (the stores above used it), and the block barrier orders
    # it before thread 0's release here; the last arrival's acquire then knows every program's
    # threads have their epoch before it flips it for the next call. After the stores: off the
    # path to the peers.
    tl.debug_barrier()
    arrived = tl.atomic_add(state_ptr + 1, 1, sem="acq_rel", scope="gpu")
    last = arrived == tl.num_programs(0) - 1
    tl.store(state_ptr, epoch ^ 1, mask=last)
    tl.store(state_ptr + 1, 0, mask=last)
    inbox = tl.multiple_of(tl.load(recvs + RANK).to(tl.pointer_type(it)), 16)
    acc = tl.zeros([BLOCK], tl.float32)
    for p in tl.static_range(WS):
        if p == RANK:
            acc += mine.to(tl.float32)
        else:
            src = inbox + (slot + p) * CAP + row * D + cols
            got = tl.zeros([BLOCK], it)
            pending = 1
            while pending != 0:
                got = tl.load(src, mask=m, other=0, volatile=True)
                pending = tl.max((got == SENT).to(tl.int32), axis=0)
            tl.store(src, tl.full([BLOCK], SENT, it), mask=m)
            acc += got.to(dt, bitcast=True).to(tl.float32)
    x = (acc.to(dt).to(tl.float32) + r.to(tl.float32)).to(dt)  # rounded as torch's add
    tl.store(res_ptr + row * stride_res + cols, x, mask=m)
    tl.store(out_ptr + row * stride_out + cols, weighted_rms_norm(x, w, D, eps).to(dt), mask=m)


class OneShotAllReduce:
    """All-reduces of up to MAX_BYTES through symmetric memory: per dtype, one send buffer and
    add_rms_norm's receive buffers."""

    MAX_BYTES = 1 << 20
    # One program per row, and a row spins until the same row of every peer has arrived: all
    # rows of a call must be resident at once on every rank, whatever order the GPUs schedule
    # them in. 128 programs need one per SM of an H100/H200 (132 SMs); the kernel's ~124-168
    # registers a thread allow 2-4.
    MAX_FUSED_ROWS = 128
    TORCH_DTYPES = (torch.bfloat16, torch.float32)  # symm_mem.one_shot_all_reduce's (no fp16)

    def __init__(self, group, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem

        self.name = group.group_name
        self.buffers, self.handles = {}, {}
        self.inboxes, self.inbox_state = {}, {}
        ws = group.size()
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            buf = symm_mem.empty(self.MAX_BYTES // dtype.itemsize, dtype=dtype, device=device)
            self.handles[dtype] = symm_mem.rendezvous(buf, self.name)
            self.buffers[dtype] = buf
            # add_rms_norm's receive buffers, [2 slots][ws senders][MAX_BYTES], all sentinel
            # (-0.0) before any peer can write there (which needs this rank's rendezvous).
            inbox = symm_mem.empty(2 * ws * self.MAX_BYTES // dtype.itemsize, dtype=dtype, device=device)
            inbox.fill_(-0.0)
            torch.cuda.synchronize(device)
            self.inboxes[dtype] = symm_mem.rendezvous(inbox, self.name)
            self.inbox_state[dtype] = torch.zeros(2, dtype=torch.int32, device=device)  # [slot epoch, arrivals]
        h = self.handles[torch.bfloat16]
        self.rank, self.world_size = h.rank, h.world_size
        self.fused = os.environ.get("RTP_LLM_FUSED_ALL_REDUCE", "1") != "0"

    def send_buffer(self, shape, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """Where a producer writes its partial sum so that no copy precedes the all-reduce (a
        view of this rank's buffer; None when it does not fit)."""
        buf = self.buffers.get(dtype)
        n = math.prod(shape)
        if buf is None or n > buf.numel():
            return None
        return buf[:n].view(shape)

    def _staged(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        part = self.send_buffer(x.shape, x.dtype)
        if part is None or not x.is_contiguous():
            return None
        if part.data_ptr() != x.data_ptr():
            part.copy_(x)
        return part

    def __call__(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """The sum of x over the ranks (x itself, reduced in place, unless x is the send
        buffer); None (nothing done) when x does not fit."""
        if x.dtype not in self.TORCH_DTYPES:
            return None
        part = self._staged(x)
        if part is None:
            return None
        out = x if part.data_ptr() != x.data_ptr() else torch.empty_like(x)
        torch.ops.symm_mem.one_shot_all_reduce_out(part, "sum", self.name, out)
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> Optional[torch.Tensor]:
        """residual += sum of x over the ranks; returns rms_norm(residual) * weight. x,
        residual: [T, D]. None (nothing done) when the fused kernel does not apply."""
        if (not self.fused or x.dim() != 2 or x.shape[0] > self.MAX_FUSED_ROWS or residual.dtype != x.dtype
                or residual.stride(1) != 1 or not weight.is_contiguous()):
            return None
        part = self._staged(x)
        if part is None:
            return None
        t, d = x.shape
        out = torch.empty_like(x)
        if t == 0:
            return out
        _push_poll_add_rms_norm_kernel[(t,)](part, self.inboxes[x.dtype].buffer_ptrs_dev, self.inbox_state[x.dtype],
                                             residual, weight, out, d, self.MAX_BYTES // x.element_size(),
                                             residual.stride(0), out.stride(0), eps, RANK=self.rank,
                                             WS=self.world_size, BITS=8 * x.element_size(),
                                             BLOCK=triton.next_power_of_2(d), num_warps=4 if d <= 4096 else 8,
                                             **launch_options())
        return out


class _SymmetricMemory(SmallAllReduce):
    """OneShotAllReduce for this process's first tensor-parallel group only: torch numbers
    symmetric-memory rendezvous per process, so ranks of a second group in a process that
    already had one would wait on keys the others never write (all ranks or none)."""

    name = "symmetric-memory all-reduce"

    def __init__(self):
        self.used = False  # this process rendezvoused symmetric memory for a group already

    def available(self) -> bool:
        return not self.used

    def create(self, group, device: torch.device) -> OneShotAllReduce:
        self.used = True
        return OneShotAllReduce(group, device)


SYMMETRIC_MEMORY = _SymmetricMemory()  # CudaBackend.small_all_reduce()
