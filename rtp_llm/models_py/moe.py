"""The mixture-of-experts MLP of Qwen3-MoE and Qwen2-MoE: the router and its top-k (route(), the
one place of the routing math), the routed experts (DeviceBackend.moe) and Qwen2-MoE's gated
shared expert. Shapes: T tokens, hidden, E experts, K = top_k, I this rank's slice of an
expert's intermediate dimension.

Tensor parallelism: every rank holds every expert, each with its slice of the intermediate
dimension (rows of gate/up, columns of down: like the dense MLP's), and the replicated router;
so each rank routes every token identically and its down projections are partial sums that the
decoder's row-parallel all-reduce completes (the routing weights and the shared expert's sigmoid
gate scale partial sums linearly, so applying them before the all-reduce is exact). Expert
parallelism can follow without changing this layout's contract: a rank would hold whole experts
of an `experts` range instead of slices of all, DeviceBackend.moe would skip the pairs routed
elsewhere (their rows contribute zero to its partial sum) and the same all-reduce would add them
up; a dispatch/combine all-to-all replaces the all-reduce only once that is faster."""

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from rtp_llm.config.model_config import MoeConfig
from rtp_llm.device.base import DeviceBackend
from rtp_llm.distributed.tensor_parallel import TPShard
from rtp_llm.model_loader.weights import DOWN, GATE_UP


def route(router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """HF's Qwen3MoeTopKRouter / Qwen2MoeTopKRouter: router_logits [T, E] (the activation
    dtype) -> (weights [T, K] in that dtype, expert ids [T, K] int64). Softmax over all E in
    fp32, the top K, renormalized to sum 1 when norm_topk_prob, then cast."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


@dataclass
class SharedExpert:
    """Qwen2-MoE's shared expert: a dense MLP every token runs, scaled by sigmoid(x . gate)."""

    gate_up: torch.Tensor  # [2 I_shared, hidden] rows of this rank, backend.pack_gate_up layout
    down: torch.Tensor     # [hidden, I_shared] columns of this rank, backend.pack_linear layout
    gate: torch.Tensor     # [1, hidden], replicated, backend.pack_linear layout


@dataclass
class MoeMLP:
    config: MoeConfig
    router: torch.Tensor   # [E, hidden] replicated, backend.pack_linear layout
    gate_up: torch.Tensor  # [E, 2 I, hidden]: each expert's gate rows, then its up rows (HF's [out, in])
    down: torch.Tensor     # [E, hidden, I]
    shared: Optional[SharedExpert] = None

    def forward(self, x: torch.Tensor, be: DeviceBackend) -> torch.Tensor:
        """x: [T, hidden] (post-attention normed) -> this rank's partial sum [T, hidden], the
        caller all-reduces it (row-parallel)."""
        m = self.config
        weights, ids = route(be.linear(x, self.router), m.top_k, m.norm_topk_prob)
        out = be.moe(x, self.gate_up, self.down, weights, ids)
        if self.shared is not None:  # HF: routed + sigmoid(gate(x)) * shared_expert(x)
            s = self.shared
            shared = be.linear(be.gate_up_silu(x, s.gate_up), s.down)
            out = out + torch.sigmoid(be.linear(x, s.gate)) * shared
        return out


def load_moe_mlp(c: MoeConfig, prefix: str, w: Callable[..., torch.Tensor], weights: Dict[str, torch.Tensor],
                 be: DeviceBackend, tp: TPShard) -> MoeMLP:
    """Layer `prefix`'s MoE MLP, this rank's shard: `w(name, rows=, cols=)` slices a checkpoint
    tensor onto the device (the decoder's); the expert stacks (pack_experts) are sliced here
    along their intermediate dimension."""
    i0, ni = tp.split(c.intermediate_size, "moe_intermediate_size")
    I = c.intermediate_size
    gate_up, down = weights[prefix + GATE_UP], weights[prefix + DOWN]  # [E, 2 I, hidden], [E, hidden, I]
    if ni < I:  # (whole, no copy, at tp 1)
        gate_up = torch.cat([gate_up[:, i0:i0 + ni], gate_up[:, I + i0:I + i0 + ni]], dim=1)
        down = down[:, :, i0:i0 + ni].contiguous()
    gate_up, down = gate_up.to(be.device), down.to(be.device)
    shared = None
    if c.shared_expert_intermediate_size:
        s0, ns = tp.split(c.shared_expert_intermediate_size, "shared_expert_intermediate_size")
        p = prefix + "mlp.shared_expert."
        shared = SharedExpert(
            gate_up=be.pack_gate_up(torch.cat([w(p + "gate_proj.weight", (s0, ns)),
                                               w(p + "up_proj.weight", (s0, ns))])),
            down=be.pack_linear(w(p + "down_proj.weight", cols=(s0, ns))),
            gate=be.pack_linear(w(prefix + "mlp.shared_expert_gate.weight")))
    return MoeMLP(c, be.pack_linear(w(prefix + "mlp.gate.weight")), gate_up, down, shared)
