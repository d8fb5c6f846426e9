"""The set-up the CUDA kernels' tests share (imported before anything imports triton): on a
machine without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1), so their
indexing and masking are checked in CI too; on a GPU they run natively. And the helpers the
CUDA tests share."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRETED:
    # Triton 3.6's interpreter turns a loaded scalar (a 1-element array) into a loop bound with
    # int(array), which numpy >= 2.4 rejects; take the element instead.
    import triton.runtime.interpreter as _interp

    _patch_lang_tensor = _interp._patch_lang_tensor

    def _patch_with_scalar_index(tensor, scope):
        _patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    if not getattr(_interp, "_rtp_llm_patched", False):
        _interp._patch_lang_tensor = _patch_with_scalar_index
        _interp._rtp_llm_patched = True

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]


def skip_interpreted_bf16_dot(dtype):
    if INTERPRETED and dtype == torch.bfloat16:
        pytest.skip("Triton 3.6's interpreter computes bf16 tl.dot wrongly (off by ~1e10 on 16x16 "
                    "randn); bf16 products are checked on a GPU")


class InterpretedCudaBackend:
    """The CUDA backend's whole step path (input packing, tile tables, fused kernels, the
    graph runner's padded persistent inputs, replayed by rerunning the step, and overlapped
    scheduling's placeholder tokens) on the CPU through Triton's interpreter, without CUDA
    runtime calls."""

    @staticmethod
    def make(graphs: bool):
        from rtp_llm.device.cuda.backend import CudaBackend
        from rtp_llm.device.cuda.graph_runner import CudaGraphRunner
        from rtp_llm.device.cuda.head_graphs import HeadGraphRunner

        class Rerun(CudaGraphRunner):
            def _capture(self, model, plan, dev):
                for kind, size, args in plan:  # every size's logits (and aux states) in the shared buffers, as captured
                    logits = model.forward(*args, logits_out=self.logits, aux_out=self.aux)

                    @torch.inference_mode()
                    def replay(a=args):
                        model.forward(*a, logits_out=self.logits, aux_out=self.aux)

                    self.graphs[(kind, size)] = (replay, logits)

        class RerunHead(HeadGraphRunner):
            def _capture(self):  # each (size, length)'s chain into its output, as captured
                for s in self.sizes:
                    for length in range(1, self.max_chain + 1):
                        out = self._chain(s, length)

                        @torch.inference_mode()
                        def replay(s=s, length=length, out=out):
                            out.copy_(self._chain(s, length))

                        self.graphs[(s, length)] = (replay, out)

        class Backend(CudaBackend):
            def __init__(self):
                self.device = torch.device(DEV)
                self.num_sms = 8
                self._pinned = torch.empty(1 << 12, dtype=torch.int32)
                self._copied = None
                self._ws, self._ws_shape = None, (0, 0, 0, 0)
                self._mla, self._mla_ws = False, None
                self._gate = None  # no stream to hold: a grammar step's sampling waits on the host

            def make_graph_runner(self, *args):
                return Rerun(args[0], self, *args[1:]) if graphs else None

            def make_head_graphs(self, *args):
                return RerunHead(args[0], self, *args[1:]) if graphs else None

            def host_copy_event(self):
                return None  # copies to the host are synchronous here

            def available_memory_bytes(self):
                return 1 << 30

            def release_memory(self):
                pass

        return Backend()


def interpreted_cuda_llm(path, monkeypatch, backend, max_num_batched_tokens: int = 16, **kwargs):
    """An LLM of `path` on `backend` (an InterpretedCudaBackend) instead of the real device's:
    fp32, 16-token steps (prompts run in chunks), 64 KV blocks, 4 streams, no warm-up; kwargs: LLM's
    others."""
    import rtp_llm.async_decoder_engine.engine as engine_mod
    from rtp_llm.llm import LLM

    monkeypatch.setattr(engine_mod, "get_backend", lambda _: backend)
    return LLM(path, act_type="fp32", progress=False, max_seq_len=128, max_num_batched_tokens=max_num_batched_tokens,
               num_kv_blocks=64, max_batch_size=4, warm_up=False, **kwargs)


def assert_greedy_equals_hf(name: str, tmp_path, monkeypatch, graphs: bool, seed: int, lens):
    """The tiny fixture `name` (testlib) through the interpreted CUDA step path (in graphs
    where asked: DecoderModel.graph_capturable must allow them) gives HF's greedy tokens for
    random prompts of `lens`, 8 new tokens each, in 16-token steps (prompts in chunks)."""
    from testlib import hf_greedy, hf_model, make_tiny, random_prompts

    path = make_tiny(name, str(tmp_path))
    hf = hf_model(path)
    llm = interpreted_cuda_llm(path, monkeypatch, InterpretedCudaBackend.make(graphs))
    try:
        assert (llm.engine.runner.graphs is not None) == graphs
        prompts = random_prompts(seed, lens)
        outs = llm.generate(prompts, {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
        for prompt, out in zip(prompts, outs):
            assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 8), (name, len(prompt))
    finally:
        llm.close()


def step_logits(llm, prompt):
    """Logits of the prefill step of `prompt`, then of one decode step (through the graph if
    enabled), and the two tokens generated."""
    from rtp_llm.config.generate_config import GenerateConfig

    core, runner = llm.engine.core, llm.engine.runner
    sid = core.enqueue(prompt, GenerateConfig(max_new_tokens=2, temperature=0).to_proto())
    out = []
    for _ in range(2):
        b = core.schedule()
        out.append(runner.logits(b)[0].float().cpu().clone())
        runner.step(core, b)
    tokens, _ = core.stream_tokens(sid)
    core.release(sid)
    return out, [int(t) for t in tokens[len(prompt):]]


def hf_step_logits(ref_dir, prompt, token, device):
    """HF's fp32 logits for prompt's last token and for `token` after it (ref_dir: a quantized
    checkpoint's exactly dequantized weights, dequantized_checkpoint)."""
    from testlib import hf_model

    model = hf_model(ref_dir, torch.float32, device)
    with torch.inference_mode():
        out = model(torch.tensor([prompt], device=device), use_cache=True)
        nxt = model(torch.tensor([[token]], device=device), past_key_values=out.past_key_values, use_cache=True)
    return [out.logits[0, -1].float().cpu(), nxt.logits[0, -1].float().cpu()]


def dequantized_checkpoint(ckpt: str, src: str, out: str) -> str:
    """src with the quantized checkpoint ckpt's projections (kept packed by the loader: FP8, GPTQ,
    AWQ), exactly dequantized, in fp32."""
    import shutil

    from safetensors.torch import load_file, save_file

    from rtp_llm.model_loader import load_model
    from rtp_llm.model_loader.quantized import QuantizedTensor

    os.makedirs(out)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    for name, w in load_model(ckpt, progress=False).weights.items():
        if isinstance(w, QuantizedTensor):
            tensors[name] = w.dequantize()
    save_file({k: v.float().contiguous() for k, v in tensors.items()}, os.path.join(out, "model.safetensors"))
    for f in ("config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), out)
    return out


def gptq_weight(n, k, bits, group, shuffled=False, seed=0, device=DEV, scale_dtype=None):
    """A random [N, K] weight as the quantize tool writes it in GPTQ (act order shuffled or not),
    read as the loader reads it: (its exactly dequantized values [N, K] fp32 in input order, the
    packed IntLinear on `device`). scale_dtype: the scales converted (GPTQ stores fp16; bf16 rounds
    them, and the dequantized values take the rounded ones)."""
    from rtp_llm.device.cuda import kernels as K
    from rtp_llm.model_loader.dequant import dequant_codes, gptq_codes
    from rtp_llm.model_loader.int_weight import from_codes
    from rtp_llm.model_loader.quant_config import parse_quant_config
    from rtp_llm.tools.quantize import quantize_gptq

    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(k, generator=g) if shuffled else None
    stored = quantize_gptq(torch.randn(n, k, generator=g) * 0.05, bits, group, order)
    qc = parse_quant_config({"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": shuffled},
                            "test")
    c = gptq_codes(stored, qc, "w", n, k)
    if scale_dtype is not None:
        c = c._replace(scales=c.scales.to(scale_dtype))
    t = from_codes(c.codes, c.zeros, c.scales, c.group_of_k, group, bits, torch.float32)
    assert (t.perm is not None) == shuffled
    packed = K.IntLinear(t.blocks.to(device), t.scale.to(device), t.zero.to(device),
                         None if t.perm is None else t.perm.to(device), t.group, t.bits, k)
    return dequant_codes(c), packed
