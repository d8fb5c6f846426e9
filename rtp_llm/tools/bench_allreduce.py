"""Latency of the tensor-parallel all-reduce of a decode step, inside a CUDA graph as the engine
runs it: the symmetric-memory one-shot kernel (OneShotAllReduce) against NCCL in the same run,
and the fused all-reduce + residual add + RMSNorm against the all-reduce followed by the add +
RMSNorm kernel. Prints microseconds per call for each size (rows x hidden, bf16).

    python -m rtp_llm.tools.bench_allreduce [--tp 2] [--hidden 4096] [--rows 1,8,64,256] [--calls 72]

--calls all-reduces per graph (Qwen3-8B: 2 per layer x 36 layers), replayed --iters times."""

import argparse
import json
import os

import torch
import torch.multiprocessing as mp


def _time_graph(device, calls: int, iters: int, op) -> float:
    """Microseconds per op() call: `calls` of them captured in one graph, replayed `iters` times."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            op()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(calls):
                op()
    torch.cuda.current_stream(device).wait_stream(stream)
    g.replay()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        g.replay()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) * 1e3 / (iters * calls)


def _rank(rank: int, a, port: int, queue):
    from rtp_llm.config.parallel_config import ParallelConfig
    from rtp_llm.device.cuda import kernels as K
    from rtp_llm.distributed.launch import set_rank_device
    from rtp_llm.distributed.tensor_parallel import init_tensor_parallel

    parallel = ParallelConfig(tp_size=a.tp, world_size=a.tp, world_rank=rank, local_world_size=a.tp,
                              master_port=port)
    device = set_rank_device("cuda", parallel)
    tp = init_tensor_parallel(parallel, device)
    one_shot = tp.one_shot
    for rows in a.rows:
        x = torch.randn(rows, a.hidden, dtype=torch.bfloat16, device=device)
        residual = torch.randn(rows, a.hidden, dtype=torch.bfloat16, device=device)
        w = torch.ones(a.hidden, dtype=torch.bfloat16, device=device)
        out = {"rows": rows, "bytes": x.numel() * x.element_size()}
        fits = one_shot is not None and x.numel() * 2 <= one_shot.MAX_BYTES
        for name, use in (("one_shot", one_shot), ("nccl", None)):
            tp.one_shot = use
            if name == "nccl" or fits:
                out[f"{name}_us"] = _time_graph(device, a.calls, a.iters, lambda: tp.all_reduce(x))
        tp.one_shot = one_shot
        if fits and one_shot.fused and rows <= one_shot.MAX_FUSED_ROWS:
            # What a decoder layer runs after a row-parallel projection, the partial sum already
            # in the send buffer: the fused kernel against all-reduce, then add + RMSNorm.
            send = tp.send_buffer(rows, a.hidden, x.dtype)
            out["fused_add_rms_norm_us"] = _time_graph(
                device, a.calls, a.iters, lambda: tp.all_reduce_add_rms_norm(send, residual, w, 1e-6, None))
            out["composed_add_rms_norm_us"] = _time_graph(
                device, a.calls, a.iters, lambda: K.rms_norm(tp.all_reduce(send), w, 1e-6, residual=residual))
        if rank == 0:
            queue.put(out)
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
