"""BENCHMARK ONLY: a paced engine that runs no model (--paced_engine_step_ms > 0).

It measures the serving path's capacity -- frontends, gRPC, detokenization, SSE -- on a
machine without a GPU, where the real CPU engine is too slow to saturate a frontend. Everything
but the model is real: the checkpoint's config and tokenizer (no weights are read), the C++
engine core (scheduler, KV-block accounting, prefix cache), its gRPC RpcService and
EngineLoop's stepping. Every step sleeps step_ms, then commits one token per sampled row.

The tokens are NOT a model's output: each stream cycles through the ids of a fixed English
paragraph, encoded once with the checkpoint's tokenizer (never a special or EOS id, so a stream
ends at its max_new_tokens or a stop string), so the text a client gets is real text that
detokenizes as text does. Never a default; never use it to report a model's speed."""

import logging
import time

import numpy as np

from rtp_llm.async_decoder_engine.engine import EngineArgs, EngineLoop
from rtp_llm.config.model_config import ModelConfig
from rtp_llm.device.base import DeviceBackend
from rtp_llm.distributed.tensor_parallel import TPShard
from rtp_llm.model_loader import find_gguf, load_tokenizer
from rtp_llm.model_loader.weights import CheckpointError
from rtp_llm.ops.engine_core import EngineCore, PromptRows, StepBatch

log = logging.getLogger(__name__)

PARAGRAPH = (
    " The river runs slowly through the old town, past the market square and the stone bridge"
    " where children gather in the evening to watch the boats go by. In spring the banks are"
    " covered with yellow flowers, and the air smells of rain and fresh bread from the bakery on"
    " the corner. Nobody remembers who built the bridge, but everyone agrees that the town would"
    " not be the same without it, and every summer there is a small festival with music, lanterns"
    " and long tables full of food that stay out until the last guests walk home after midnight."
)


def read_config(checkpoint_path: str, model_type=None) -> ModelConfig:
    """The checkpoint's ModelConfig without its weights (a GGUF file's metadata or an HF
    directory's config.json)."""
    gguf_path = find_gguf(checkpoint_path)
    if gguf_path:
        from rtp_llm.model_loader.gguf_loader import read_gguf_config

        return read_gguf_config(gguf_path, model_type)
    from rtp_llm.model_loader.hf_loader import read_hf_config

    return read_hf_config(checkpoint_path, model_type)


def paragraph_ids(tokenizer, text: str = PARAGRAPH) -> np.ndarray:
    """The token ids a paced stream cycles through: `text` encoded, special ids (EOS among
    them) left out."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    ids = [i for i in tokenizer.encode(text, add_special_tokens=False) if i not in special]
    if not ids:
        raise ValueError("the tokenizer encodes the paced engine's paragraph to no ordinary token")
    return np.asarray(ids, dtype=np.int32)


class PacedRunner:
    """EngineLoop's runner without a model: sleeps step_ms, then commits each sampled row's next
    paragraph token (by its count of generated tokens, so a stream reads the paragraph from
    its start, wrapping around, whatever else shares the step). No model: every log-prob it
    reports (sampled tokens', prompt rows') is 0, with no alternatives."""

    def __init__(self, step_ms: float, token_ids: np.ndarray):
        self.step_s = step_ms / 1000.0
        self.token_ids = token_ids

    def step(self, core: EngineCore, b: StepBatch):
        time.sleep(self.step_s)
        generated = b.num_generated[b.do_sample == 1]
        prompt = PromptRows(np.zeros(b.num_prompt_logprobs, np.float32)) if b.num_prompt_logprobs else None
        core.commit(self.token_ids[generated % len(self.token_ids)], prompt=prompt)


class PacedEngineLoop(EngineLoop):
    """EngineLoop (its stepping, start/stop, failure handling) over a PacedRunner: a real
    EngineCore with KV blocks for max_batch_size streams of max_seq_len (blocks are only
    accounted; no memory holds a KV cache), no device, one rank, no overlap. It sets what
    EngineLoop's stepping reads (args, tp, broadcast, core, runner, max_seq_len, num_blocks and
    _init_stepping's state) instead of building a model, and has nothing to warm up."""

    def __init__(self, config: ModelConfig, tokenizer, args: EngineArgs, step_ms: float):
        if not step_ms > 0:
            raise ValueError(f"--paced_engine_step_ms must be > 0 for the paced engine, got {step_ms}")
        args.validate()
        log.warning("BENCHMARK-ONLY PACED ENGINE (--paced_engine_step_ms=%g): no model runs; every step sleeps "
                    "%g ms and emits the tokens of a fixed paragraph, which are not a model's output. It measures "
                    "the serving path only: never use it to report a model's speed.", step_ms, step_ms)
        self.args = args
        self.tp = TPShard()
        self.broadcast = None
        self.max_seq_len = args.seq_len(config)
        block = args.seq_size_per_block
        self.num_blocks = args.max_batch_size * -(-self.max_seq_len // block)
        self.core = EngineCore(self.num_blocks, block, args.max_batch_size, args.step_tokens(DeviceBackend),
                               self.max_seq_len, args.reuse_cache, config.eos_token_ids)
        self.runner = PacedRunner(step_ms, paragraph_ids(tokenizer))
        self._init_stepping(overlap=False)
        log.info("paced engine: %d KV blocks x %d tokens (accounting only), max_seq_len %d, %d paragraph tokens",
                 self.num_blocks, block, self.max_seq_len, len(self.runner.token_ids))

    def close(self):
        self.stop()
        self.core.close()


def paced_engine(checkpoint_path: str, model_type, tokenizer_path, args: EngineArgs, step_ms: float) -> PacedEngineLoop:
    """The paced engine for a checkpoint: its config and tokenizer, no weights."""
    tokenizer = load_tokenizer(checkpoint_path, tokenizer_path)
    if tokenizer is None:
        raise CheckpointError(f"{checkpoint_path} has no tokenizer, which the paced engine's tokens come from: "
                              f"pass --tokenizer_path")
    return PacedEngineLoop(read_config(checkpoint_path, model_type), tokenizer, args, step_ms)
