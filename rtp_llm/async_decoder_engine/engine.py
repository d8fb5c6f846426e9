"""The Python side of the engine: builds the core, the KV cache and the model runner from a
loaded model, and steps them (schedule -> model -> sample -> commit), in the caller's
thread (offline) or in a background thread (server).

Overlap (devices that run asynchronously): each step is scheduled and launched
ahead of the previous step's tokens, before that step commits, so the host's scheduling,
input preparation and commit hide behind the device's work:

    host:   schedule N+1 | launch N+1 | wait N, commit N | schedule N+2 | launch N+2 | wait N+1 ...
    device: ......... step N ..........|............. step N+1 ..............|.... step N+2

A step with grammar rows cannot sample until the step before it committed (its tokens advance
the matchers its mask is filled from). Its forward is queued ahead as usual; it samples in the
next turn, after that commit and after the step behind it was staged (model_runner.py), so the
device goes from its sampling straight to the next forward. Its mask is filled on a thread of
its own (mask_filler.py: xgrammar releases the GIL) while this thread schedules and stages that
step:

    host:   wait N, commit N | schedule, stage N+2 | sample N+1 | forward N+2 | wait N+1 ...
    filler:                  | mask N+1 ...........|
    device: ....... forward N+1 ......................................| sample N+1 | forward N+2

Where the device has a gate (DeviceBackend.host_gate: CUDA), the host does not wait for the
mask: it queues the mask's upload, the sampling and the next forward behind a wait on the
device that the filler opens when the mask is done, so the device idles only if the fill
outlasts the forward in flight:

    host:   wait N, commit N | schedule, stage N+2 | gate, sample N+1, forward N+2 | wait N+1 ...
    filler:                  | mask N+1 ........ open |
    device: ....... forward N+1 ...........................| sample N+1 | forward N+2
"""

import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Optional

import torch

from rtp_llm.async_decoder_engine.draft_model import DraftModel, check_draft, load_draft
from rtp_llm.async_decoder_engine.eagle_drafter import EagleDrafter
from rtp_llm.async_decoder_engine.grammar import GrammarBook, GrammarOptions, make_grammar_book
from rtp_llm.async_decoder_engine.host_profile import HostProfile
from rtp_llm.async_decoder_engine.model_runner import Forwarded, ModelRunner, PendingStep, StagedStep
from rtp_llm.config.quantization import check_kv_cache_dtype
from rtp_llm.config.speculative import SpeculativeConfig
from rtp_llm.device import get_backend
from rtp_llm.distributed.tensor_parallel import CollectiveError, StepBroadcast, TPShard
from rtp_llm.model_loader import LoadedModel
from rtp_llm.model_loader.weights import active_elements
from rtp_llm.models_py.decoder import DecoderModel
from rtp_llm.models_py.eagle3 import Eagle3Head, read_eagle3_config, read_eagle3_weights
from rtp_llm.models_py.mtp import MtpHead, mtp_layers
from rtp_llm.ops.engine_core import EngineCore
from rtp_llm.utils.host_heap import settle_heap

log = logging.getLogger(__name__)


@dataclass
class EngineArgs:
    device: str = "cpu"
    max_seq_len: Optional[int] = None       # default: the model's max_position_embeddings, capped at 8192
    max_batch_size: int = 64
    max_num_batched_tokens: Optional[int] = None  # default: the device's (DeviceBackend)
    seq_size_per_block: int = 16
    kv_cache_mem_mb: Optional[int] = None   # default: the backend's (CPU: 1/4 of free memory, <= 4 GiB)
    kv_cache_dtype: str = "auto"            # "auto": the run dtype; "fp8": e4m3 (DeviceBackend.kv_cache_dtype)
    num_kv_blocks: Optional[int] = None     # exact block count instead of a memory budget (tests, tuning)
    reuse_cache: bool = True
    warm_up: bool = True
    cuda_graph: bool = True                 # decode steps replay captured graphs (devices that have them)
    overlap_schedule: Optional[bool] = None  # default: on where the device runs asynchronously (CUDA)
    grammar: GrammarOptions = None          # default: GrammarOptions()
    speculative: SpeculativeConfig = None   # default: off (config/speculative.py)
    host_profile: bool = False              # log the engine thread's host time by phase per burst (host_profile.py)

    def validate(self) -> None:
        for name in ("max_batch_size", "max_num_batched_tokens", "seq_size_per_block"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ValueError(f"--max_seq_len must be >= 2, got {self.max_seq_len}")
        if self.kv_cache_mem_mb is not None and self.kv_cache_mem_mb < 1:
            raise ValueError(f"--kv_cache_mem_mb must be >= 1, got {self.kv_cache_mem_mb}")
        check_kv_cache_dtype(self.kv_cache_dtype, self.device)
        self.grammar = self.grammar or GrammarOptions()
        self.speculative = self.speculative or SpeculativeConfig()
        self.speculative.validate()
        if self.grammar.threads < 1:
            raise ValueError(f"--grammar_num_workers must be >= 1, got {self.grammar.threads}")
        if not self.grammar.timeout_s > 0:
            raise ValueError(f"--grammar_admission_compile_timeout_s must be > 0, got {self.grammar.timeout_s}")

    def step_tokens(self, backend, config=None, tp_size: int = 1) -> int:
        """max_num_batched_tokens, or the device's default (a DeviceBackend or its class) for the
        model `config` (a ModelConfig; None: the device's default budget) split over tp_size ranks."""
        if self.max_num_batched_tokens:
            return self.max_num_batched_tokens
        token_flops = 2 * active_elements(config, lm_head=False) / tp_size if config is not None else None
        return backend.default_step_tokens(token_flops)

    def seq_len(self, config) -> int:
        """max_seq_len, or its default for the model `config` (a ModelConfig)."""
        return self.max_seq_len or min(config.max_position_embeddings, 8192)


class EngineLoop:
    """Rank 0 (or the only rank) owns the C++ core and steps it; under tensor parallelism the
    other ranks hold shards of the model and KV cache and follow rank 0's steps (run_worker)."""

    def __init__(self, loaded: LoadedModel, args: EngineArgs, tp: Optional[TPShard] = None,
                 draft: Optional[LoadedModel] = None):
        """draft: the draft model of --sp_type=vanilla (default: loaded from sp_checkpoint_path as
        `loaded` was: draft_model.load_draft)."""
        args.validate()
        self.loaded = loaded
        self.args = args
        self.tp = tp = tp or TPShard()
        self.broadcast = StepBroadcast(tp) if tp.size > 1 else None
        c = loaded.config
        self.backend = get_backend(args.device)
        if args.seq_size_per_block not in self.backend.block_sizes:
            raise ValueError(f"--seq_size_per_block {args.seq_size_per_block} is not supported on {args.device} "
                             f"(supported: {self.backend.block_sizes})")
        self.max_seq_len = args.seq_len(c)
        block = args.seq_size_per_block
        # Weights first: on a GPU the KV cache takes what they leave free.
        model = DecoderModel(c, loaded.weights, self.backend, self.max_seq_len, tp)
        # The model holds its own (fused, transposed) copies: drop the loaded tensors rather
        # than keep the weights in memory twice.
        loaded.weights.clear()
        draft_model = self._draft_model(loaded, draft, tp) if args.speculative.draft_model else None
        head = self._head(model, loaded, tp) if args.speculative.head else None
        kv_dtype = self.backend.kv_cache_dtype(args.kv_cache_dtype, loaded.dtype)
        for m in (model, draft_model):
            if m is not None and m.kv_cache_spec.is_mla and kv_dtype != loaded.dtype:
                raise ValueError(f"--kv_cache_dtype={args.kv_cache_dtype} is not supported for model_type "
                                 f"{m.config.model_type} (its latent cache is kept in the run dtype); use "
                                 f"--kv_cache_dtype=auto")
        # This rank's, in the model's layout; a draft model's cache mirrors the target's block for block.
        block_bytes = sum(m.kv_cache_spec.block_bytes(block, kv_dtype) for m in (model, draft_model, head)
                          if m is not None)
        if args.num_kv_blocks:
            num_blocks, budget = args.num_kv_blocks, args.num_kv_blocks * block_bytes
        else:
            budget = (args.kv_cache_mem_mb << 20) if args.kv_cache_mem_mb else self.backend.default_kv_cache_bytes()
            num_blocks = budget // block_bytes
        num_blocks = tp.min_over_ranks(num_blocks)  # rank 0's block ids index every rank's shard
        min_blocks = -(-self.max_seq_len // block)
        if num_blocks < min_blocks:
            raise ValueError(f"the KV cache (--kv_cache_mem_mb={budget >> 20}) holds {num_blocks} blocks of {block} tokens; one "
                             f"sequence of max_seq_len={self.max_seq_len} needs {min_blocks}: raise the budget or "
                             f"lower --max_seq_len")
        self.num_blocks = int(num_blocks)
        step_tokens = args.step_tokens(self.backend, c, tp.size)
        log.info("KV cache: %d blocks x %d tokens (%d MiB, %s), max_seq_len %d, max_batch_size %d, "
                 "max_num_batched_tokens %d", self.num_blocks, block, self.num_blocks * block_bytes >> 20,
                 str(kv_dtype).replace("torch.", ""), self.max_seq_len, args.max_batch_size, step_tokens)
        spec = args.speculative.core_config()
        self.core = EngineCore(self.num_blocks, block, args.max_batch_size, step_tokens,
                               self.max_seq_len, args.reuse_cache, c.eos_token_ids, c.vocab_size,
                               **spec) if tp.rank == 0 else None
        kv = self.backend.allocate_cache(model.kv_cache_spec, self.num_blocks, block, kv_dtype)
        # The pool and the index of its blocks dimension (allocate_cache's layouts): prefill/decode
        # disaggregation moves its blocks (rtp_llm/pd/).
        self.kv_cache, self.kv_blocks_dim = kv, 1 if model.kv_cache_spec.is_mla else 2
        # A step's sampled rows: one per stream, and one more per drafted token (within the budget).
        rows = min(step_tokens, args.max_batch_size * (1 + spec["gen_num_per_cycle"]))
        self.runner = ModelRunner(model, self.backend, kv, block, args.max_batch_size, self.max_seq_len,
                                  step_tokens, use_graphs=args.cuda_graph,
                                  max_sampled_rows=max(rows, args.max_batch_size))
        if draft_model is not None:
            draft_kv = self.backend.allocate_cache(draft_model.kv_cache_spec, self.num_blocks, block, kv_dtype)
            self.runner.drafter = DraftModel(ModelRunner(draft_model, self.backend, draft_kv, block,
                                                         args.max_batch_size, self.max_seq_len, step_tokens,
                                                         use_graphs=args.cuda_graph, bind=False),
                                             args.max_batch_size)
        if head is not None:
            head_kv = self.backend.allocate_cache(head.kv_cache_spec, self.num_blocks, block, kv_dtype)
            graphs = None
            if args.cuda_graph and head.graph_capturable:
                graphs = self.backend.make_head_graphs(head, head_kv, block, args.max_batch_size, self.max_seq_len,
                                                       loaded.dtype, args.speculative.gen_num_per_cycle - 1)
            self.runner.drafter = EagleDrafter(head, self.backend, head_kv, block, args.max_batch_size,
                                               len(model.aux_layers) * c.hidden_size, loaded.dtype, graphs)
        overlap = self.backend.async_execution if args.overlap_schedule is None else args.overlap_schedule
        grammar = None
        if self.core is not None:
            grammar = make_grammar_book(self.core, loaded.tokenizer_source(), c.vocab_size, list(c.eos_token_ids),
                                        args.max_batch_size, self.backend.device, self.runner.sampler.pin_host,
                                        args.grammar, fill_thread=overlap, gate=self.backend.host_gate())
            self.runner.grammar = grammar
        self._init_stepping(overlap, grammar)  # (ranks > 0 get the sampled tokens by broadcast: model_runner)
        if args.warm_up and self.core is not None:
            self.warm_up()
        settle_heap()  # (loading's and warm-up's temporaries)
        if args.host_profile and self.core is not None:
            self.host_profile = HostProfile(self)

    def _head(self, model: DecoderModel, loaded: LoadedModel, tp: TPShard):
        """The drafting head of --sp_type=eagle3 or mtp on this device (eagle_drafter.py); `model` keeps
        the hidden states it reads."""
        spec = self.args.speculative
        spec.check_ranks(tp.size)
        if spec.eagle3:
            config = read_eagle3_config(spec.sp_checkpoint_path, loaded.config)
            head = Eagle3Head(config, read_eagle3_weights(spec.sp_checkpoint_path), self.backend, loaded.dtype,
                              self.max_seq_len, model.embed_rows)
            what = f"EAGLE-3 head {spec.sp_checkpoint_path} (draft vocabulary {config.draft_vocab_size})"
        else:
            path = spec.sp_checkpoint_path or loaded.checkpoint_path
            mtp_layers(path, loaded.config)
            head = MtpHead(loaded.config, path, self.backend, loaded.dtype, self.max_seq_len,
                           model=model if path == loaded.checkpoint_path else None)
            what = f"multi-token-prediction layer of {path}"
        model.aux_layers = head.aux_layers
        log.info("%s, reading the target's layers %s, proposes up to %d tokens a step", what, list(head.aux_layers),
                 spec.gen_num_per_cycle)
        return head

    def _draft_model(self, loaded: LoadedModel, draft: Optional[LoadedModel], tp: TPShard) -> DecoderModel:
        """The draft model of --sp_type=vanilla on this device (its loaded weights dropped)."""
        spec = self.args.speculative
        spec.check_ranks(tp.size)
        draft = draft or load_draft(spec, loaded, self.args.device)
        check_draft(loaded.config, draft.config, spec.sp_checkpoint_path)
        model = DecoderModel(draft.config, draft.weights, self.backend, self.max_seq_len, tp)
        draft.weights.clear()
        log.info("draft model %s (%s, %d layers) proposes up to %d tokens a step", spec.sp_checkpoint_path,
                 draft.config.model_type, draft.config.num_layers, spec.gen_num_per_cycle)
        return model

    def _init_stepping(self, overlap: bool, grammar: Optional[GrammarBook] = None):
        """The stepping state, once self.core and self.runner exist. grammar: rank 0's (None:
        grammars are refused, this engine samples none)."""
        self._thread: Optional[threading.Thread] = None
        self._running = False
        self.overlap = bool(overlap)
        self._pending: Optional[PendingStep] = None  # sampled, not yet committed (overlap)
        self._unsampled: Optional[Forwarded] = None  # forward queued; samples once _pending commits (grammar rows)
        self.grammar = grammar
        self.host_profile: Optional[HostProfile] = None  # (--host_profile: set once the engine is built)
        if grammar is None and self.core is not None:
            self.grammar = GrammarBook.refusing(self.core, "this engine does not sample with grammars")

    def step(self) -> bool:
        """One step in the caller's thread; False when there was nothing to run (nor a grammar
        compiling for a stream that will). With overlap a step launched here commits in the
        next call: call until False (or drain())."""
        self.grammar.poll()
        if self.overlap:
            return self._step_ahead()
        b = self.core.schedule()
        if b.num_streams == 0:
            return self.grammar.wait_for_compiles()
        try:
            if self.broadcast is not None:
                self.broadcast.send(b)
            self.runner.step(self.core, b)
        except CollectiveError:
            raise  # a rank is gone or timed out: the group is unusable, stop (see _loop)
        except Exception as e:
            self._fail(e, b.num_streams, len(b.token_ids))
        return True

    def _step_ahead(self) -> bool:
        """One turn of the overlapped pipeline (module docstring): schedules the next step ahead
        of the pending one and queues it, then commits the pending one. A step that fails fails
        itself and the steps after it; the ones before it ran, and commit."""
        unsampled, self._unsampled = self._unsampled, None
        mask = None
        if unsampled is not None:
            if not self._commit_pending():  # (its mask needs those tokens)
                return True
            try:
                mask = self.runner.fill_mask(unsampled)  # filled on the book's thread while b is staged
            except Exception as e:
                self._fail(e, unsampled.batch.num_streams, len(unsampled.batch.token_ids))
                return True
        b = self.core.schedule_ahead()
        staged, error = None, None
        if b.num_streams:
            try:
                staged = self._stage(b)
            except CollectiveError:
                raise
            except Exception as e:
                error = e
        if unsampled is not None:  # sampled before b's forward, which reads its tokens
            try:
                self._pending = self.runner.sample(unsampled, mask)
            except CollectiveError:
                raise
            except Exception as e:
                self._fail(e, b.num_streams, len(b.token_ids))  # (it and b: every uncommitted step)
                return True
        new = None
        if staged is not None:
            try:
                step = self.runner.forward(staged, self._pending)
                if step.needs_mask:
                    self._unsampled = step  # the pending step commits first, in the next turn
                    return True
                new = self.runner.sample(step)
            except CollectiveError:
                raise
            except Exception as e:
                error = e
        pending, self._pending = self._pending, new
        if pending is not None and not self._commit(pending):
            return True
        if error is not None:
            self._fail(error, b.num_streams, len(b.token_ids))  # b is the one uncommitted step now
        return b.num_streams > 0 or pending is not None or self.grammar.wait_for_compiles()

    def _stage(self, b) -> StagedStep:
        if self.broadcast is not None:
            self.broadcast.send(b)
        return self.runner.stage(b)

    def _commit(self, step: PendingStep) -> bool:
        """Commits a sampled step; False when that failed: the steps after it read its tokens,
        so every uncommitted step failed with it."""
        try:
            self.runner.commit(self.core, step)
        except CollectiveError:
            raise
        except Exception as e:
            self._fail(e, 0, 0)
            return False
        return True

    def _commit_pending(self) -> bool:
        pending, self._pending = self._pending, None
        return pending is None or self._commit(pending)

    def drain(self):
        """Commits what is still in flight (overlap), launching nothing new."""
        unsampled, self._unsampled = self._unsampled, None
        if not self._commit_pending() or unsampled is None:
            return
        try:
            self._pending = self.runner.sample(unsampled)
        except Exception as e:
            self._fail(e, 0, 0)
            return
        self._commit_pending()

    def _fail(self, e: Exception, num_streams: int, num_tokens: int):
        """A failed step fails its requests (and with overlap every step in flight); the engine
        serves on."""
        self._pending = self._unsampled = None
        if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
            # Reported, not a crash: the memory the requests held is released with them.
            log.error("out of memory in a model step of %d streams (%d tokens): %s", num_streams, num_tokens, e)
            self.core.fail_batch(f"model execution failed: out of memory in a step of {num_streams} requests "
                                 f"({type(e).__name__}: {e}); retry, or lower --max_num_batched_tokens / "
                                 f"--max_batch_size")
        else:
            log.error("model step failed; failing its %d streams", num_streams, exc_info=e)
            self.core.fail_batch(f"model execution failed: {type(e).__name__}: {e}")

    def run_worker(self):
        """A rank > 0: runs every step batch rank 0 broadcasts until it says stop. A failing step
        fails on every rank alike (same batch, same code), so the worker carries on; a
        collective that errors or times out ends it."""
        while True:
            b = self.broadcast.recv()
            if b is None:
                return
            try:
                self.runner.logits(b)
            except CollectiveError:
                raise
            except Exception:
                log.exception("rank %d: model step failed", self.tp.rank)

    def warm_up(self):
        from rtp_llm.config.generate_config import GenerateConfig

        sid = self.core.enqueue([0] * min(16, self.max_seq_len - 2), GenerateConfig(max_new_tokens=2,
                                                                                     temperature=0).to_proto())
        while self.step():
            pass
        self.core.release(sid)
        self.runner.sampler.warm_up_mask(self.runner.model.config.vocab_size)

    def _in_flight(self) -> bool:
        return self._pending is not None or self._unsampled is not None

    def start(self):
        """Steps in a background thread until stop()."""
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="rtp_llm-engine", daemon=True)
        self._thread.start()

    def _loop(self):
        if self.host_profile is not None:
            self.host_profile.reset()  # (made in the constructor's thread: its thread counters are this one's)
        try:
            while self._running:
                # (A stream whose grammar compiles is no work for the core yet, but its compile
                # timeout runs in step().)
                if self._in_flight() or self.core.wait_for_work(100) or self.grammar.compiling():
                    self.step()
                elif self.host_profile is not None and self.host_profile.counts:
                    log.info("host profile of the burst: %s", json.dumps(self.host_profile.report()))
                    self.host_profile.reset()
            self.drain()
        except BaseException:
            # A failing step only fails its requests (step()); anything else that escapes must not
            # leave clients hanging: the process exits and its supervisor (start_server) stops
            # the server with this log line as the reason.
            log.exception("the engine loop failed; exiting")
            os._exit(1)

    def stop(self):
        self._running = False
        if self.core is None:
            return
        self.core.stop()
        if self._thread:
            self._thread.join()
            self._thread = None
        if self.broadcast is not None:
            self.broadcast.send_stop()
            self.broadcast = None

    def close(self):
        """Stops and frees the core, the KV cache, the weights and any captured graphs (device
        memory returns to the device, not just to this process's allocator)."""
        self.stop()
        if self.grammar is not None:
            self.grammar.close()
        if self.core is not None:
            self.core.close()
        self.runner = None
        self.backend.release_memory()
