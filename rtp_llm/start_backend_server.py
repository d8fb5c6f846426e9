"""A backend process: one rank. Rank 0 loads its shard of the model, runs the engine loop and
serves RpcService on start_port + 1 (loopback; every interface on a DECODE instance, for its
PREFILL instances) until SIGTERM/SIGINT; other ranks (--tp_size
> 1) load theirs and follow rank 0's steps until it stops them. With --paced_engine_step_ms
(benchmark only) the one rank loads no model and its engine emits paced tokens instead."""

import logging
import signal
import sys
import threading

from rtp_llm.config.model_config import REFUSED_EXIT, ModelRefused
from rtp_llm.config.server_config import ServerConfig, parse_server_config

log = logging.getLogger("rtp_llm.backend")


def _engine_args(config: ServerConfig):
    from rtp_llm.async_decoder_engine.engine import EngineArgs
    from rtp_llm.async_decoder_engine.grammar import GrammarOptions

    grammar = GrammarOptions(threads=config.grammar_num_workers, timeout_s=config.grammar_admission_compile_timeout_s,
                             compact_json=config.constrained_json_disable_any_whitespace)
    return EngineArgs(device=config.device, max_seq_len=config.max_seq_len, max_batch_size=config.max_batch_size,
                      max_num_batched_tokens=config.max_num_batched_tokens,
                      seq_size_per_block=config.seq_size_per_block, kv_cache_mem_mb=config.kv_cache_mem_mb,
                      kv_cache_dtype=config.kv_cache_dtype,
                      reuse_cache=config.reuse_cache, cuda_graph=config.cuda_graph,
                      overlap_schedule=None if config.overlap_schedule else False, grammar=grammar,
                      speculative=config.speculative(), host_profile=config.host_profile)


def _model_engine(config: ServerConfig):
    """This rank's EngineLoop over its shard of the model."""
    from rtp_llm.async_decoder_engine.engine import EngineLoop
    from rtp_llm.distributed.launch import set_rank_device
    from rtp_llm.distributed.tensor_parallel import init_tensor_parallel
    from rtp_llm.model_loader import load_model, parse_dtype

    parallel = config.parallel(config.world_rank)
    tp = init_tensor_parallel(parallel, set_rank_device(config.device, parallel))
    # The backend encodes nothing (the frontends do): no tokenizer, and not even transformers,
    # until a first grammar has the compiler load one (a large vocabulary's is large:
    # docs/benchmarks.md).
    loaded = load_model(config.checkpoint_path, config.model_type, parse_dtype(config.act_type),
                        config.tokenizer_path, progress=tp.rank == 0, quantization=config.quantization or None,
                        load_format=config.load_format, tokenizer=False, device=config.device)
    return EngineLoop(loaded, _engine_args(config), tp)


def _paced_engine(config: ServerConfig):
    """Benchmark only (--paced_engine_step_ms): no model, paced tokens (async_decoder_engine/paced.py)."""
    from rtp_llm.async_decoder_engine.paced import paced_engine

    return paced_engine(config.checkpoint_path, config.model_type, config.tokenizer_path, _engine_args(config),
                        config.paced_engine_step_ms)


def serve(config: ServerConfig) -> int:
    engine = _paced_engine(config) if config.paced_engine_step_ms else _model_engine(config)
    tp = engine.tp
    if tp.rank != 0:
        engine.run_worker()  # returns when rank 0 stops; raises (exit 1) if rank 0 is gone
        log.info("rank %d stopping", tp.rank)
        return 0
    from rtp_llm.pd import handoff

    pd = handoff.start(config.pd(), engine)
    port = engine.core.start_rpc_server(config.rpc_bind_address)
    engine.start()
    log.info("backend serving RpcService on %s:%d (%s)", config.pd().rpc_bind_host, port, config.role_type)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("backend stopping")
    engine.core.stop_rpc_server()  # cancels calls in progress; their streams are aborted
    engine.stop()  # and the other ranks
    if pd is not None:
        pd.close()
    return 0


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_server_config(argv, __doc__)
    try:
        return serve(config)
    except ModelRefused as e:
        log.error("cannot serve --checkpoint_path=%s: %s", config.checkpoint_path, e)
        return REFUSED_EXIT


if __name__ == "__main__":
    sys.exit(main())
