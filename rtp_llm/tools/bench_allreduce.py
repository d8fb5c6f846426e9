"""Latency of the tensor-parallel all-reduce of a decode step, inside a CUDA graph as the engine
runs it: the symmetric-memory one-shot kernel (OneShotAllReduce) against NCCL in the same run.
Prints microseconds per all-reduce for each size (rows x hidden, bf16).

    python -m rtp_llm.tools.bench_allreduce [--tp 2] [--hidden 4096] [--rows 1,8,64,256] [--calls 72]

--calls all-reduces per graph (Qwen3-8B: 2 per layer x 36 layers), replayed --iters times."""

import argparse
import json
import os

import torch
import torch.multiprocessing as mp


def _rank(rank: int, a, port: int, queue):
    from rtp_llm.distributed.launch import set_rank_device
    from rtp_llm.distributed.tensor_parallel import ParallelConfig, init_tensor_parallel

    parallel = ParallelConfig(tp_size=a.tp, world_size=a.tp, world_rank=rank, local_world_size=a.tp,
                              master_port=port)
    device = set_rank_device("cuda", parallel)
    tp = init_tensor_parallel(parallel, device)
    one_shot = tp.one_shot
    for rows in a.rows:
        x = torch.randn(rows, a.hidden, dtype=torch.bfloat16, device=device)
        out = {"rows": rows, "bytes": x.numel() * x.element_size()}
        for name, use in (("one_shot", one_shot), ("nccl", None)):
            tp.one_shot = use
            if name == "one_shot" and (use is None or x.numel() * 2 > use.MAX_BYTES):
                continue
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(3):
                    tp.all_reduce(x)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=stream):
                    for _ in range(a.calls):
                        tp.all_reduce(x)
            torch.cuda.current_stream(device).wait_stream(stream)
            g.replay()
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(a.iters):
                g.replay()
            end.record()
            torch.cuda.synchronize(device)
            out[f"{name}_us"] = start.elapsed_time(end) * 1e3 / (a.iters * a.calls)
        if rank == 0:
            queue.put(out)
    tp.one_shot = one_shot
    torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--rows", default="1,8,64,256")
    p.add_argument("--calls", type=int, default=72)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    a.rows = [int(r) for r in a.rows.split(",")]
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    from rtp_llm.distributed.tensor_parallel import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, a, port, queue)) for r in range(a.tp)]
    for proc in procs:
        proc.start()
    for _ in a.rows:
        print(json.dumps(queue.get(timeout=300)), flush=True)
    for proc in procs:
        proc.join()


if __name__ == "__main__":
    main()
