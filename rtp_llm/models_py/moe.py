"""The mixture-of-experts MLP of Qwen3-MoE, Qwen2-MoE and DeepSeek-V2/V3: the router and its
top-k (route(), the one place of the routing math, run through DeviceBackend.moe_route, which a
device may fuse), the routed experts (DeviceBackend.moe) and the shared expert (Qwen2-MoE's
gated, DeepSeek's plain). Shapes: T tokens, hidden, E experts, K = top_k, I this rank's slice of
an expert's intermediate dimension.

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
from rtp_llm.model_loader.weights import DOWN, GATE_UP, shared_expert_prefix


def route(router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """HF's Qwen3MoeTopKRouter / Qwen2MoeTopKRouter: router_logits [T, E] (the activation
    dtype) -> (weights [T, K] in that dtype, expert ids [T, K] int64). Softmax over all E in
    fp32, the top K, renormalized to sum 1 when norm_topk_prob, then cast."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def _group_mask(scores: torch.Tensor, group_scores: torch.Tensor, m: MoeConfig) -> torch.Tensor:
    """[T, E] bool: the experts of each token's topk_group best groups (group_scores [T, n_group])."""
    best = torch.topk(group_scores, k=m.topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, best, 1)
    return mask.unsqueeze(-1).expand(-1, m.n_group, m.num_experts // m.n_group).reshape(scores.shape).bool()


def route_deepseek(router_logits: torch.Tensor, m: MoeConfig,
                   correction_bias: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """HF's DeepseekV2TopkRouter / DeepseekV3TopkRouter, op for op: router_logits [T, E] fp32
    -> (weights [T, K] fp32, ids [T, K] int64), top-k unsorted as HF takes them (the order the
    experts' outputs are summed in). greedy: softmax, top-k. group_limited_greedy: softmax, the
    groups ranked by their best score, the others' scores zeroed, top-k. noaux_tc: sigmoid; the
    choice by score + correction_bias [E], groups ranked by the sum of their two best, the weights
    the chosen experts' plain scores, renormalized when norm_topk_prob. All times
    routed_scaling_factor."""
    if m.routing == "noaux_tc":
        scores = router_logits.sigmoid()
        choice = scores + correction_bias
        groups = choice.view(-1, m.n_group, m.num_experts // m.n_group).topk(2, dim=-1)[0].sum(dim=-1)
        choice = choice.masked_fill(~_group_mask(choice, groups, m), float("-inf"))
        ids = torch.topk(choice, k=m.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if m.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True) + 1e-20
    else:
        scores = router_logits.softmax(dim=-1, dtype=torch.float32)
        if m.routing == "group_limited_greedy":
            groups = scores.view(-1, m.n_group, m.num_experts // m.n_group).max(dim=-1).values
            scores = scores.masked_fill(~_group_mask(scores, groups, m), 0.0)
        weights, ids = torch.topk(scores, k=m.top_k, dim=-1, sorted=False)
    return weights * m.routed_scaling_factor, ids


@dataclass
class SharedExpert:
    """A dense MLP every token runs: Qwen2-MoE's scaled by sigmoid(x . gate), DeepSeek's not."""

    gate_up: torch.Tensor  # [2 I_shared, hidden] rows of this rank, backend.pack_gate_up layout
    down: torch.Tensor     # [hidden, I_shared] columns of this rank, backend.pack_linear layout
    gate: Optional[torch.Tensor]  # [1, hidden], replicated, backend.pack_linear layout (None: ungated)


@dataclass
class MoeMLP:
    config: MoeConfig
    router: torch.Tensor   # [E, hidden] replicated, backend.pack_linear layout (DeepSeek: fp32 [hidden, E])
    gate_up: torch.Tensor  # [E, 2 I, hidden]: each expert's gate rows, then its up rows (HF's [out, in])
    down: torch.Tensor     # [E, hidden, I]
    shared: Optional[SharedExpert] = None
    correction_bias: Optional[torch.Tensor] = None  # [E] fp32: noaux_tc's e_score_correction_bias

    def forward(self, x: torch.Tensor, be: DeviceBackend) -> torch.Tensor:
        """x: [T, hidden] (post-attention normed) -> this rank's partial sum [T, hidden], the
        caller all-reduces it (row-parallel)."""
        m = self.config
        if m.routing == "softmax":
            weights, ids = be.moe_route(be.linear(x, self.router), m.top_k, m.norm_topk_prob)
        else:  # DeepSeek: HF routes in fp32 with an fp32 router whatever the run dtype
            weights, ids = route_deepseek(torch.matmul(x.float(), self.router), m, self.correction_bias)
            weights = weights.to(x.dtype)
        out = be.moe(x, self.gate_up, self.down, weights, ids)
        if self.shared is not None:  # HF: routed + [sigmoid(gate(x)) *] shared_expert(x)
            s = self.shared
            shared = be.linear(be.gate_up_silu(x, s.gate_up), s.down)
            out = out + (shared if s.gate is None else torch.sigmoid(be.linear(x, s.gate)) * shared)
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
        p = prefix + shared_expert_prefix(c)
        shared = SharedExpert(
            gate_up=be.pack_gate_up(torch.cat([w(p + "gate_proj.weight", (s0, ns)),
                                               w(p + "up_proj.weight", (s0, ns))])),
            down=be.pack_linear(w(p + "down_proj.weight", cols=(s0, ns))),
            gate=be.pack_linear(w(prefix + "mlp.shared_expert_gate.weight")) if c.shared_expert_gate else None)
    if c.routing == "softmax":
        return MoeMLP(c, be.pack_linear(w(prefix + "mlp.gate.weight")), gate_up, down, shared)
    # DeepSeek: the router (and noaux_tc's bias) stay fp32 as loaded (weights.fp32_weights)
    bias = w(prefix + "mlp.gate.e_score_correction_bias").float() if c.routing == "noaux_tc" else None
    return MoeMLP(c, w(prefix + "mlp.gate.weight").float().t().contiguous(), gate_up, down, shared, bias)
