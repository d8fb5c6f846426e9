"""The NPU backend without an NPU, honestly: the exact schemas of the torch_npu ops it calls,
read from the pinned torch_npu wheel (@torch_npu_wheel in WORKSPACE, the version
deps/requirements_ascend.txt pins; read as a zip, never installed: it would hijack `import
torch` without CANN), are registered on CPU torch under their namespaces (npu, atb) with
reference kernels; the NPU backend's model path runs through them and must give the CPU
backend's greedy tokens. A wrong argument name, type, order or count fails at the dispatcher,
as it would on the NPU. What this cannot show: the kernels' numerics and speed on Ascend."""

import glob
import os
import re
import tempfile
import unittest
import zipfile

import torch
import yaml

import rtp_llm.async_decoder_engine.engine as engine_mod
from rtp_llm.device.npu import backend as npu_backend
from rtp_llm.llm import LLM
from rtp_llm.test.testlib import make_tiny, random_prompts

BACKEND_SRC = npu_backend.__file__


def _runfile(pattern: str) -> str:
    found = glob.glob(os.path.join(os.environ.get("TEST_SRCDIR", "."), pattern))
    if not found:
        raise FileNotFoundError(f"{pattern} not in the runfiles")
    return found[0]


def _pinned_torch_npu() -> str:
    for line in open(_runfile("*/deps/requirements_ascend.txt")):
        m = re.match(r"torch_npu==(\S+)", line.strip())
        if m:
            return m.group(1)
    raise AssertionError("deps/requirements_ascend.txt pins no torch_npu")


def _schemas(wheel: zipfile.ZipFile) -> dict:
    """namespace -> op name -> schema, as the wheel defines them."""
    native = {}  # the custom ops torch_npu defines in its own namespace (torch.ops.npu)
    for entry in yaml.safe_load(wheel.read("torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"))["custom"]:
        native.setdefault(entry["func"].split("(")[0], entry["func"])
    atb = {}
    blob = wheel.read("torch_npu/lib/libop_plugin_atb.so")  # ATB ops register their schemas as strings
    for m in re.finditer(rb"(_npu_[a-z_0-9]+)\(([ -~]+?)\) -> \(\)", blob):
        atb.setdefault(m.group(1).decode(), f"{m.group(1).decode()}({m.group(2).decode()}) -> ()")
    return {"npu": native, "atb": atb}


def _used_ops():
    src = open(BACKEND_SRC).read()
    return (sorted(set(re.findall(r"torch\.ops\.(npu|atb)\.(\w+)", src))),
            sorted(set(re.findall(r"torch\.npu\.(\w+)", src))))


# ------------------------------------------------------------------ reference kernels (CPU)

def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _rms(x, gamma, eps):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (gamma * (xf * rstd).to(x.dtype)), rstd


def _gather(cache, table, n):
    """cache [blocks, page, Hkv, D] (or [blocks, page, Hkv*D]) -> the first n tokens [n, ...]."""
    page = cache.shape[1]
    pos = torch.arange(n)
    return cache[table[pos // page].long(), pos % page]


def _attend(q, k, v, scale, first_pos):
    """q [n, H, D] at positions first_pos.., k/v [c, Hkv, D]: causal attention."""
    h, hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(h // hkv, dim=1).float()
    v = v.repeat_interleave(h // hkv, dim=1).float()
    att = torch.einsum("nhd,chd->hnc", q.float(), k) * scale
    mask = torch.arange(k.shape[0])[None, :] > (first_pos + torch.arange(q.shape[0]))[:, None]
    return torch.einsum("hnc,chd->nhd", att.masked_fill(mask, float("-inf")).softmax(-1), v).to(q.dtype)


def _paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                     context_lens, out, workspace=None):
    assert query.shape[1] == num_heads and key_cache.shape[2] == num_kv_heads
    for s in range(query.shape[0]):
        c = int(context_lens[s])
        out[s] = _attend(query[s:s + 1], _gather(key_cache, block_table[s], c),
                         _gather(value_cache, block_table[s], c), scale_value, c - 1)[0]


def _reshape_and_cache(key, value, key_cache, value_cache, slot_indices):
    hkv, d = key_cache.shape[2], key_cache.shape[3]
    key_cache.view(-1, hkv, d)[slot_indices.long()] = key
    value_cache.view(-1, hkv, d)[slot_indices.long()] = value


def _fused_infer_attention_score(query, key, value, *, atten_mask=None, actual_seq_lengths=None,
                                 actual_seq_lengths_kv=None, block_table=None, num_heads=1, scale=1.0,
                                 input_layout="BSH", num_key_value_heads=0, sparse_mode=0, block_size=0, **_):
    # What the backend relies on: TND queries, paged K/V [blocks, block_size, Hkv * D] through
    # block_table, right-down causal masking (sparse_mode 3) with the 2048 x 2048 mask.
    assert input_layout == "TND" and sparse_mode == 3 and block_table is not None
    assert atten_mask is not None and tuple(atten_mask.shape) == (2048, 2048)
    assert key.shape[1] == block_size and key.shape[2] == num_key_value_heads * query.shape[2]
    out = torch.empty_like(query)
    start = 0
    for s, (end, c) in enumerate(zip(actual_seq_lengths, actual_seq_lengths_kv)):
        d = query.shape[2]
        k = _gather(key, block_table[s], c).view(c, num_key_value_heads, d)
        v = _gather(value, block_table[s], c).view(c, num_key_value_heads, d)
        out[start:end] = _attend(query[start:end], k, v, scale, c - (end - start))
        start = end
    return out, torch.empty(0)


REFERENCE = {
    ("npu", "npu_rms_norm"): lambda self, gamma, epsilon=1e-6: _rms(self, gamma, epsilon),
    ("npu", "npu_add_rms_norm"): lambda x1, x2, gamma, epsilon=1e-6: (*_rms(x1 + x2, gamma, epsilon), x1 + x2),
    ("npu", "npu_rotary_mul"): lambda self, r1, r2, rotary_mode="half", rotate=None: (
        (self.float() * r1.float() + _rotate_half(self.float()) * r2.float()).to(self.dtype)),
    ("npu", "npu_swiglu"): lambda self, dim=-1: (lambda a, b: torch.nn.functional.silu(a) * b)(*self.chunk(2, dim)),
    ("npu", "npu_fused_infer_attention_score"): _fused_infer_attention_score,
    ("atb", "_npu_paged_attention"): _paged_attention,
    ("atb", "_npu_reshape_and_cache"): _reshape_and_cache,
}


class NpuSchemaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.wheel = zipfile.ZipFile(_runfile("torch_npu_wheel/file/*.whl"))
        cls.schemas = _schemas(cls.wheel)
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_wheel_is_the_pinned_version(self):
        self.assertIn(f"torch_npu-{_pinned_torch_npu()}-", os.path.basename(self.wheel.filename))

    def test_every_torch_npu_name_the_backend_uses_exists_in_the_wheel(self):
        ops, npu_attrs = _used_ops()
        self.assertTrue(ops, "the backend calls no torch_npu op?")
        for ns, name in ops:
            self.assertIn(name, self.schemas[ns], f"torch.ops.{ns}.{name} is not in the torch_npu wheel")
        npu_module = (self.wheel.read("torch_npu/npu/__init__.py") + self.wheel.read("torch_npu/npu/utils.py")).decode()
        for attr in npu_attrs:
            self.assertRegex(npu_module, rf"\b{attr}\b", f"torch.npu.{attr} is not in torch_npu")

    def test_npu_backend_through_the_exact_schemas_equals_the_cpu_backend(self):
        ops, _ = _used_ops()
        libs = {ns: torch.library.Library(ns, "DEF") for ns in {ns for ns, _ in ops}}
        for ns, name in ops:
            libs[ns].define(self.schemas[ns][name])  # the wheel's schema, verbatim
            libs[ns].impl(name, REFERENCE[(ns, name)], "CPU")
        # chunked prefill (chunks after a cached prefix, mixed steps); the same KV capacity
        # (1,024 tokens) in the CPU backend's blocks of 64 and the NPU's of 128
        args = dict(act_type="fp32", progress=False, max_seq_len=256, max_num_batched_tokens=32)
        cfg = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
        real_get_backend = engine_mod.get_backend
        for name in ("qwen3_gqa_untied", "qwen2_mqa_tied"):
            with self.subTest(name):
                path = make_tiny(name, self.tmp.name)
                batch = random_prompts(3, (3, 40, 17, 70))
                cpu = LLM(path, seq_size_per_block=64, num_kv_blocks=16, **args)
                want = [o.outputs[0].token_ids for o in cpu.generate(batch, cfg)]
                cpu.close()
                engine_mod.get_backend = lambda _: npu_backend.NpuBackend(device=torch.device("cpu"))
                try:
                    npu = LLM(path, seq_size_per_block=128, num_kv_blocks=8, **args)
                finally:
                    engine_mod.get_backend = real_get_backend
                got = [o.outputs[0].token_ids for o in npu.generate(batch, cfg)]
                npu.close()
                self.assertEqual(got, want)


if __name__ == "__main__":
    unittest.main()
