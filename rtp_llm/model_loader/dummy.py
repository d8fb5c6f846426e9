"""--load_format=dummy (vLLM's name for it): random weights of the model's shapes, made in memory
from config.json alone, for benchmarks of checkpoints that do not fit on the benchmark machine's
disk (a 61 GB MoE beside everything else) or that no registry here ships. Speed does not depend
on the values; generate fixed lengths with ignore_eos. Never a default; the server logs it.

Values: projections and embeddings uniform in +-0.035 (standard deviation ~0.02, HF's init),
norms 1, biases and DeepSeek's score correction 0; the run dtype, except what stays fp32 in any
run (weights.fp32_weights). Seeded, so two runs (or two servers compared) hold the same weights.
A config.json's quantization_config is not applied: the weights are the run dtype's."""

import logging
from typing import Dict

import torch
from tqdm import tqdm

from rtp_llm.config.model_config import ModelConfig
from rtp_llm.model_loader.weights import expected_weights, fp32_weights, pack_experts

log = logging.getLogger(__name__)

_BOUND = 0.035


def dummy_value(name: str, shape, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """One weight's random value by its checkpoint name (the distribution above); also how a
    benchmark gives a peer engine the same distribution (bench_gpu.vllm_offline)."""
    dev = gen.device
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype, device=dev)
    if name.endswith(".bias") or name.endswith("e_score_correction_bias"):
        return torch.zeros(shape, dtype=dtype, device=dev)
    return torch.empty(shape, dtype=dtype, device=dev).uniform_(-_BOUND, _BOUND, generator=gen)


def dummy_weights(config: ModelConfig, dtype: torch.dtype, progress: bool = True, seed: int = 0,
                  device: str = "cpu") -> Dict[str, torch.Tensor]:
    """Every weight the model expects (weights.expected_weights), random as above, MoE experts
    packed as a checkpoint's are. device: where to make them: a CUDA run's GPU makes a 30B
    model's in seconds (the CPU takes minutes); any other device's are made on the CPU."""
    log.warning("--load_format=dummy: random weights, for benchmarks only")
    gen = torch.Generator(device=device if str(device).startswith("cuda") else "cpu").manual_seed(seed)
    shapes = expected_weights(config)
    weights = {}
    for name, shape in tqdm(shapes.items(), desc="making dummy weights", unit="tensor", disable=not progress):
        weights[name] = dummy_value(name, shape, torch.float32 if fp32_weights(config, name) else dtype, gen)
    pack_experts(config, weights)
    return weights
