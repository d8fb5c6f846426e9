"""Turns the core's step batch into device tensors, runs the model and samples."""

import os

import numpy as np
import torch

from rtp_llm.device.base import DeviceBackend
from rtp_llm.models_py.decoder import DecoderModel
from rtp_llm.models_py.sampler import Sampler, SamplingRows
from rtp_llm.ops.engine_core import EngineCore, StepBatch


class ModelRunner:
    def __init__(self, model: DecoderModel, backend: DeviceBackend, kv_cache: torch.Tensor, block_size: int):
        # Test-only fault injection: a step whose batch holds this token id raises.
        poison = os.environ.get("RTP_LLM_TEST_FAIL_ON_TOKEN")
        self.poison_token = int(poison) if poison else None
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.sampler = Sampler(backend.device)

    def logits(self, b: StepBatch) -> torch.Tensor:
        """[num_sampled, vocab] fp32 logits of the streams whose next token this step yields."""
        if self.poison_token is not None and (b.token_ids == self.poison_token).any():
            raise RuntimeError(f"injected fault (RTP_LLM_TEST_FAIL_ON_TOKEN={self.poison_token})")
        dev = self.backend.device
        token_ids = torch.from_numpy(b.token_ids.astype(np.int64)).to(dev)
        positions = torch.from_numpy(b.positions.astype(np.int64)).to(dev)
        rows = (b.query_starts[1:] - 1)[b.do_sample == 1]
        meta = self.backend.prepare_attention(b, self.block_size)
        return self.model.forward(token_ids, positions, meta, self.kv_cache, torch.from_numpy(rows.astype(np.int64)))

    def step(self, core: EngineCore, b: StepBatch):
        """Runs `b` and commits the sampled tokens to `core`."""
        logits = self.logits(b)
        s = b.do_sample == 1
        rows = SamplingRows(
            stream_ids=b.stream_ids[s], temperature=b.temperature[s], top_k=b.top_k[s], top_p=b.top_p[s],
            min_p=b.min_p[s], repetition_penalty=b.repetition_penalty[s], presence_penalty=b.presence_penalty[s],
            frequency_penalty=b.frequency_penalty[s], random_seed=b.random_seed[s], num_generated=b.num_generated[s])
        tokens, logprobs = self.sampler.sample(logits, rows, core.stream_tokens)
        core.commit(tokens, logprobs)
