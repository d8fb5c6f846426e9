"""Turns the core's step batch into device tensors, runs the model and samples."""

import os
import threading

import torch

from rtp_llm.device.base import DeviceBackend
from rtp_llm.models_py.decoder import DecoderModel
from rtp_llm.models_py.sampler import Sampler, SamplingRows
from rtp_llm.ops.engine_core import EngineCore, StepBatch


def _inject(kind: str, token: int):
    what = f"injected fault (RTP_LLM_TEST_FAIL_ON_TOKEN={token}:{kind})"
    if kind == "oom":
        raise torch.OutOfMemoryError(what)
    if kind == "memory":
        raise MemoryError(what)
    if kind == "hang":
        threading.Event().wait()
    raise RuntimeError(what)


class ModelRunner:
    def __init__(self, model: DecoderModel, backend: DeviceBackend, kv_cache: torch.Tensor, block_size: int,
                 max_batch_size: int, max_seq_len: int, max_num_batched_tokens: int, use_graphs: bool = True):
        # Test-only fault injection: a step whose batch holds one of these token ids fails.
        # "499" raises a RuntimeError; "499:oom,498:hang" picks the fault per token: out of
        # memory (torch.OutOfMemoryError), MemoryError ("memory") or a step that never ends.
        poison = os.environ.get("RTP_LLM_TEST_FAIL_ON_TOKEN") or ""
        self.faults = {int(t): kind or "error" for t, _, kind in (p.partition(":") for p in poison.split(",") if p)}
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.sampler = Sampler(backend.device)
        backend.bind_model(model.num_heads, model.num_kv_heads, model.config.head_dim, max_batch_size, max_seq_len)
        # Steps replay captured graphs where the device has them (CUDA).
        self.graphs = backend.make_graph_runner(model, kv_cache, block_size, max_batch_size, max_seq_len,
                                                max_num_batched_tokens) if use_graphs else None

    def logits(self, b: StepBatch) -> torch.Tensor:
        """[num_sampled, vocab] fp32 logits of the streams whose next token this step yields."""
        for token, kind in self.faults.items():
            if (b.token_ids == token).any():
                _inject(kind, token)
        if self.graphs is not None:
            logits = self.graphs.run(b)
            if logits is not None:
                return logits
        x = self.backend.prepare_inputs(b, self.block_size)
        return self.model.forward(x.token_ids, x.positions, x.meta, self.kv_cache, x.sample_rows)

    def step(self, core: EngineCore, b: StepBatch):
        """Runs `b` and commits the sampled tokens to `core`."""
        logits = self.logits(b)
        s = b.do_sample == 1
        rows = SamplingRows(
            stream_ids=b.stream_ids[s], temperature=b.temperature[s], top_k=b.top_k[s], top_p=b.top_p[s],
            min_p=b.min_p[s], repetition_penalty=b.repetition_penalty[s], presence_penalty=b.presence_penalty[s],
            frequency_penalty=b.frequency_penalty[s], random_seed=b.random_seed[s], num_generated=b.num_generated[s],
            return_logprobs=b.return_logprobs[s])
        tokens, logprobs = self.sampler.sample(logits, rows, core.stream_tokens)
        core.commit(tokens, logprobs)
