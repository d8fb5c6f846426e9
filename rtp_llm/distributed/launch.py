"""Starting tensor-parallel ranks on one node: rank 0 is the caller; ranks 1..tp-1 are spawned
processes that load their own shard of the checkpoint and follow rank 0's steps."""

import logging
import multiprocessing
from dataclasses import asdict
from typing import List

import torch

from rtp_llm.config.parallel_config import ParallelConfig
from rtp_llm.device import backend_class
from rtp_llm.distributed.tensor_parallel import init_tensor_parallel

log = logging.getLogger(__name__)


def set_rank_device(device: str, parallel: ParallelConfig) -> torch.device:
    """This rank's device of --device `device`, made the current one (DeviceBackend.rank_device)."""
    return backend_class(device).rank_device(parallel.local_rank)


def _worker_main(load_args: dict, engine_args: dict, parallel: dict):
    from rtp_llm.async_decoder_engine.engine import EngineArgs, EngineLoop
    from rtp_llm.model_loader import load_model, parse_dtype

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = ParallelConfig(**parallel)
    args = EngineArgs(**engine_args)
    tp = init_tensor_parallel(config, set_rank_device(args.device, config))
    loaded = load_model(load_args["checkpoint_path"], load_args["model_type"], parse_dtype(load_args["act_type"]),
                        load_args["tokenizer_path"], False, load_args.get("quantization"),
                        load_args.get("load_format", "auto"), device=args.device)
    engine = EngineLoop(loaded, args, tp)
    engine.run_worker()
    engine.close()
    torch.distributed.destroy_process_group()


def spawn_workers(load_args: dict, engine_args: dict, parallel: ParallelConfig) -> List[multiprocessing.Process]:
    """Ranks 1..tp_size-1 of this node, as spawned processes (not forked: no inherited threads,
    locks or CUDA context)."""
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for rank in range(1, parallel.tp_size):
        p = ctx.Process(target=_worker_main, name=f"rtp_llm-tp-rank{rank}", daemon=True,
                        args=(load_args, engine_args, dict(asdict(parallel), world_rank=rank)))
        p.start()
        procs.append(p)
    return procs
