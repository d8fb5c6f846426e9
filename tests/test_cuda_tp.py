"""Tensor parallelism on two GPUs: the fused symmetric-memory all-reduce + residual add +
RMSNorm against the composed ops (NCCL all-reduce, then the add + RMSNorm kernel), bit for bit,
eager and replayed in a CUDA graph, alone and fed by the MLP's GEMVs as the decoder runs them
in bf16; and TP=2 greedy tokens equal to TP=1 on the tiny fixture models (fp32). Marked `gpu`:
skipped with fewer than two GPUs."""

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


def _fused_all_reduce_rank(rank: int, port: int, errors):
    import torch.distributed as dist

    from rtp_llm.device.cuda import kernels as K
    from rtp_llm.distributed.tensor_parallel import ParallelConfig, init_tensor_parallel

    try:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        tp = init_tensor_parallel(ParallelConfig(tp_size=2, world_size=2, world_rank=rank, master_port=port), dev)
        assert tp.one_shot is not None and tp.one_shot.fused
        for dtype in (torch.bfloat16, torch.float32):
            for rows, d in ((1, 4096), (3, 1000), (64, 1024)):
                g = torch.Generator().manual_seed(rows)
                residual0 = torch.randn(rows, d, generator=g).to(dtype).to(dev)  # the same on both ranks
                w = torch.randn(d, generator=g).to(dtype).to(dev)
                parts = [torch.randn(rows, d, generator=g).to(dtype).to(dev) for _ in range(2)]
                parts[0][:, ::5] = -0.0  # the receive buffers' sentinel, sent as +0.0
                parts[1][:, ::3] = -0.0
                want_res = residual0.clone()
                summed = parts[rank].clone()
                dist.all_reduce(summed)
                want = K.rms_norm(summed, w, 1e-6, residual=want_res)

                # The producer writes into the send buffer, as the decoder's projections do.
                res = residual0.clone()
                x = tp.send_buffer(rows, d, dtype)
                x.copy_(parts[rank])
                got = tp.all_reduce_add_rms_norm(x, res, w, 1e-6, backend=None)
                torch.cuda.synchronize()
                assert torch.equal(got, want) and torch.equal(res, want_res), (dtype, rows, d, "eager")

                # Replayed from a graph: the receive buffers must come back to the sentinel and the
                # slots must keep alternating in step on both ranks.
                res.copy_(residual0)
                stream = torch.cuda.Stream(dev)
                stream.wait_stream(torch.cuda.current_stream(dev))
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
                    out = None
                    for _ in range(3):
                        x = tp.send_buffer(rows, d, dtype)
                        x.copy_(parts[rank])
                        out = tp.all_reduce_add_rms_norm(x, res, w, 1e-6, backend=None)
                torch.cuda.current_stream(dev).wait_stream(stream)
                for _ in range(4):
                    res.copy_(residual0)
                    graph.replay()
                    torch.cuda.synchronize()
                    want_res = residual0.clone()
                    for _ in range(3):
                        want = K.rms_norm(summed, w, 1e-6, residual=want_res)
                    assert torch.equal(res, want_res) and torch.equal(out, want), (dtype, rows, d, "graph")

        # A decoder layer's MLP under TP, as the backend runs it at batch 1: the gated GEMV,
        # then the down GEMV writing into the send buffer (both PDL-launched on Hopper) feeding
        # the fused kernel; against the same GEMVs into plain memory, NCCL, add + RMSNorm.
        g = torch.Generator().manual_seed(11 + rank)
        d, i = 1024, 384
        x = torch.randn(1, d, generator=g).to(torch.bfloat16).to(dev)
        gate_up = (torch.randn(2 * i, d, generator=g) / d ** 0.5).to(torch.bfloat16).to(dev)
        down = (torch.randn(d, i, generator=g) / i ** 0.5).to(torch.bfloat16).to(dev)
        w = torch.randn(d, generator=torch.Generator().manual_seed(12)).to(torch.bfloat16).to(dev)
        residual0 = torch.randn(1, d, generator=torch.Generator().manual_seed(13)).to(torch.bfloat16).to(dev)
        want_res = residual0.clone()
        summed = K.gemv(K.gemv(x, gate_up, gated=True), down)
        dist.all_reduce(summed)
        want = K.rms_norm(summed, w, 1e-6, residual=want_res)

        def mlp_tail(res):
            part = K.gemv(K.gemv(x, gate_up, gated=True), down, out=tp.send_buffer(1, d, torch.bfloat16))
            return tp.all_reduce_add_rms_norm(part, res, w, 1e-6, backend=None)

        res = residual0.clone()
        got = mlp_tail(res)
        torch.cuda.synchronize()
        assert torch.equal(got, want) and torch.equal(res, want_res), "gemv -> fused, eager"
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            out = mlp_tail(res)
        torch.cuda.current_stream(dev).wait_stream(stream)
        for _ in range(3):
            res.copy_(residual0)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want) and torch.equal(res, want_res), "gemv -> fused, graph"
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # reported by the parent
        errors.put(f"rank {rank}: {type(e).__name__}: {e}")
        raise


def test_fused_all_reduce_add_rms_norm_equals_the_composed_ops():
    import torch.multiprocessing as mp

    from rtp_llm.distributed.tensor_parallel import free_port

    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_fused_all_reduce_rank, args=(r, port, errors)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank hung (barrier never released)"
    assert errors.empty(), errors.get()
    assert all(p.exitcode == 0 for p in procs)


def test_tp2_greedy_tokens_equal_tp1():
    import tempfile

    from testlib import make_tiny, random_prompts

    from rtp_llm.llm import LLM

    batch = random_prompts(1, (3, 17, 40, 9, 33))
    with tempfile.TemporaryDirectory() as root:
        for name in ("qwen3_gqa_untied", "qwen2_mqa_tied"):
            path = make_tiny(name, root)
            runs = []
            for tp in (1, 2):
                llm = LLM(path, act_type="fp32", progress=False, device="cuda", tp_size=tp, max_seq_len=128)
                try:
                    outs = llm.generate(batch, {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True})
                    runs.append([o.outputs[0].token_ids for o in outs])
                finally:
                    llm.close()
            assert runs[1] == runs[0], name
