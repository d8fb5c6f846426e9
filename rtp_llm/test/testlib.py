"""What the tests share: tiny random-weight checkpoints, HF transformers' references, random
prompts, and real servers (started as subprocesses, probed on /health, stopped) with their
SSE framing.

One module for both kinds of test: the bazel unit tests (rtp_llm/test/, the py_library
//rtp_llm:testlib) import it as `rtp_llm.test.testlib`; the integration tests (tests/, run with
pytest against the installed wheel, which does not ship rtp_llm/test) import it as `testlib`,
which tests/conftest.py loads from this file. So it imports nothing of its own package
relatively, and `rtp_llm` only from the installed (or bazel-built) package, lazily."""

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Dict, Optional

import torch

# ------------------------------------------------------------------ tiny checkpoints

TINY = {
    # name: (transformers config class, kwargs)
    "qwen3_gqa_untied": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                             tie_word_embeddings=False)),
    "qwen2_mqa_tied": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)),
    "llama_gqa_tied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                           rope_theta=100000.0)),
    "llama_mha_untied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=4,
                                             tie_word_embeddings=False)),
}
# Mixture-of-experts fixtures (kept apart from TINY: their own tests, moe_parity_test.py): odd
# expert counts, top-k > 1, a dense first layer (mlp_only_layers) or dense layers between
# sparse ones (decoder_sparse_step), norm_topk_prob on and off, Qwen2-MoE's shared expert.
TINY_MOE = {
    "qwen3_moe_dense_first": ("Qwen3MoeConfig", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                                     tie_word_embeddings=False, num_experts=5, num_experts_per_tok=2,
                                                     moe_intermediate_size=64, mlp_only_layers=[0],
                                                     norm_topk_prob=True)),
    "qwen3_moe_raw_topk": ("Qwen3MoeConfig", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                                  tie_word_embeddings=True, num_experts=7, num_experts_per_tok=3,
                                                  moe_intermediate_size=64, norm_topk_prob=False)),
    "qwen2_moe_shared": ("Qwen2MoeConfig", dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
                                                tie_word_embeddings=False, num_experts=5, num_experts_per_tok=2,
                                                moe_intermediate_size=64, shared_expert_intermediate_size=128,
                                                decoder_sparse_step=2, norm_topk_prob=False)),
}
# DeepSeek-V2/V3 fixtures (mla_test.py): multi-head latent attention with and without q LoRA,
# v_head_dim unlike qk_nope + qk_rope, interleaved and plain rope, YaRN with an attention factor
# and mscale_all_dim's softmax scale; odd expert counts, top-k > 1, a dense first layer,
# greedy, group-limited and noaux_tc routing, shared experts, routed_scaling_factor.
_MLA = dict(num_attention_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=20,
            moe_intermediate_size=48, first_k_dense_replace=1, num_hidden_layers=3, tie_word_embeddings=False)
_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32, "beta_slow": 1}
TINY_MLA = {
    "deepseek_v2_grouped": ("DeepseekV2Config", dict(_MLA, q_lora_rank=None, n_routed_experts=9, num_experts_per_tok=3,
                                                     topk_method="group_limited_greedy", n_group=3, topk_group=2,
                                                     n_shared_experts=2, routed_scaling_factor=1.5,
                                                     rope_scaling=dict(_YARN, mscale=0.707, mscale_all_dim=0.707))),
    "deepseek_v2_greedy_qlora": ("DeepseekV2Config", dict(_MLA, q_lora_rank=48, n_routed_experts=5,
                                                          num_experts_per_tok=2, topk_method="greedy",
                                                          n_shared_experts=1)),
    "deepseek_v3_noaux": ("DeepseekV3Config", dict(_MLA, q_lora_rank=48, n_routed_experts=9, num_experts_per_tok=3,
                                                   n_group=3, topk_group=2, n_shared_experts=1, norm_topk_prob=True,
                                                   routed_scaling_factor=2.5, rope_interleave=True,
                                                   rope_scaling=dict(_YARN, mscale=1.0, mscale_all_dim=0.8))),
    "deepseek_v3_plain_rope": ("DeepseekV3Config", dict(_MLA, q_lora_rank=None, n_routed_experts=7,
                                                        num_experts_per_tok=2, n_group=1, topk_group=1,
                                                        n_shared_experts=1, norm_topk_prob=False,
                                                        routed_scaling_factor=1.0, rope_interleave=False)),
}
TINY_VOCAB = 512


def make_tiny(name: str, root: str, spec=None) -> str:
    """Writes the tiny HF checkpoint `name` (TINY: Qwen3, Qwen2, Llama; GQA, MQA, tied and
    untied; TINY_MOE: Qwen3-MoE, Qwen2-MoE; TINY_MLA: DeepSeek-V2/V3) under root and returns its directory. The weights
    are scaled up so that greedy choices are decisive rather than near-ties; the seed is the
    name's, so a name always gives the same weights; spec, (config class, kwargs), names another
    module's fixture. (rtp_llm.tools.random_checkpoint writes benchmark-sized Qwen3 checkpoints whose
    values do not matter; these are for parity.)"""
    import transformers

    cls_name, kwargs = spec or {**TINY, **TINY_MOE, **TINY_MLA}[name]
    config = getattr(transformers, cls_name)(**{
        "vocab_size": TINY_VOCAB, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "max_position_embeddings": 512, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
        **kwargs})
    torch.manual_seed(sum(map(ord, name)))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif pname.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:  # norm weights
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        for bname, b in model.named_buffers():  # DeepSeek-V3's routing bias: a buffer, saved
            if bname.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.3)
    path = os.path.join(root, name)
    model.save_pretrained(path, safe_serialization=True)
    return path


def make_loopy(root: str, name: str = "loopy", logit_scale: float = 1.0) -> str:
    """qwen3_gqa_untied with its attention outputs scaled down (o_proj x 0.05): its greedy text
    falls into short loops and escapes them (attention still matters), so speculative drafts are
    accepted and rejected both; logit_scale > 1 sharpens its logits (lm_head x scale) so that
    sampling at temperature > 0 loops as well."""
    import glob

    from safetensors.torch import load_file, save_file

    path = make_tiny("qwen3_gqa_untied", os.path.join(root, name))
    f = glob.glob(os.path.join(path, "*.safetensors"))[0]
    w = load_file(f)

    def scale(k: str) -> float:
        return 0.05 if k.endswith("o_proj.weight") else logit_scale if k == "lm_head.weight" else 1.0
    save_file({k: v * scale(k) if scale(k) != 1.0 else v for k, v in w.items()}, f, metadata={"format": "pt"})
    return path


TINY_EOS = "<|end|>"


def add_tiny_tokenizer(path: str) -> str:
    """Writes a byte-level BPE tokenizer of TINY_VOCAB tokens (TINY_EOS first, id 0, the EOS)
    into the checkpoint at `path`, trained on JSON-like text, so grammars over the tiny models
    have multi-byte tokens to choose from. Returns path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[TINY_EOS], show_progress=False)
    words = [a + b + c for a in "bdfklmnprst" for b in "aeiou" for c in ("", "n", "s")]
    corpus = ['{"name": "Ada", "age": 36, "tags": ["x", "yy"], "ok": true, "n": null}',
              '[1, 2, 3] {"a": {"b": "c"}}', " ".join(words), '", "'.join(words), "0123456789 " * 4]
    tok.train_from_iterator(corpus * 20, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=TINY_EOS).save_pretrained(path)
    return path


def random_prompts(seed: int, lengths, prefix=()):
    """Prompts of random token ids below the tiny vocabulary, one per length, after `prefix`."""
    g = torch.Generator().manual_seed(seed)
    return [list(prefix) + torch.randint(0, TINY_VOCAB, (n,), generator=g).tolist() for n in lengths]


def repetitive_prompts():
    """Copy-style prompts (a random block repeated) and plain random ones (speculative decoding)."""
    blocks = random_prompts(7, [6, 9, 13])
    return [b * 4 for b in blocks] + random_prompts(8, [20, 9])


def overlap_sampling_configs(prompt_tail: int):
    """generate_configs whose tokens must not depend on overlapped scheduling: seeded samples,
    penalties (while such a stream samples the engine steps in turn) and a stop word."""
    return [{"max_new_tokens": 40, "temperature": 0.9, "top_k": 50, "random_seed": 3},
            {"max_new_tokens": 40, "temperature": 0.7, "random_seed": 4, "repetition_penalty": 1.3},
            {"max_new_tokens": 40, "temperature": 0, "stop_words_list": [[prompt_tail]]}]


def _quantize_matrix(a, qtype: str):
    import gguf

    if qtype in ("Q4_K", "Q6_K"):  # (rtp_llm.test is not in the wheel: only bazel tests write these)
        from rtp_llm.test.kquants import QUANTIZERS

        return QUANTIZERS[qtype](a)
    return gguf.quants.quantize(a, gguf.GGMLQuantizationType[qtype])


def write_gguf(hf_dir: str, path: str, qtype: str = "Q8_0", qtypes: Optional[Dict[str, str]] = None) -> str:
    """Writes the HF checkpoint at hf_dir (a make_tiny one) as a GGUF file as llama.cpp's
    converter would: its metadata, every matrix in `qtype` (gguf's own quantizer; Q4_K and Q6_K
    test.kquants') or, for HF names ending in a key of `qtypes`, in that value's type (as
    llama.cpp's mixes do), vectors in F32, llama-arch q/k rows permuted for llama.cpp's rotary
    layout. Token list placeholders of the vocabulary's size (pass the checkpoint's
    tokenizer_path). Returns path."""
    import json

    import gguf
    import numpy as np
    from safetensors.torch import load_file

    from rtp_llm.model_loader.gguf_loader import _GLOBAL_NAMES, _LAYER_NAMES
    from rtp_llm.model_loader.gguf_moe import MOE_LAYER_NAMES

    with open(os.path.join(hf_dir, "config.json")) as f:
        c = json.load(f)
    arch = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
            "Qwen3MoeForCausalLM": "qwen3moe", "Qwen2MoeForCausalLM": "qwen2moe"}[c["architectures"][0]]
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    w = gguf.GGUFWriter(path, arch)
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    if arch.endswith("moe"):
        _add_moe_metadata(w, c)
        tensors = _stack_experts(tensors)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(c.get("head_dim") or c["hidden_size"] // heads)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(c.get("rope_theta") or c.get("rope_parameters", {}).get("rope_theta", 10000.0))
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(c["vocab_size"])])
    to_gguf = {v: k for k, v in _GLOBAL_NAMES.items()}
    layer_names = {v: k for k, v in {**_LAYER_NAMES, **MOE_LAYER_NAMES}.items()}
    for name, t in tensors.items():
        rest = ""
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            gname = f"blk.{layer}.{layer_names.get(rest, rest)}"  # (expert stacks: their GGUF names)
        else:
            gname = to_gguf[name]
        a = t.float().numpy()
        if arch == "llama" and rest.startswith(("self_attn.q_proj.", "self_attn.k_proj.")):
            n = heads if "q_proj" in rest else kv_heads
            a = a.reshape(n, 2, a.shape[0] // n // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
        if rest == "mlp.shared_expert_gate.weight":
            a = a.reshape(-1)  # llama.cpp's ffn_gate_inp_shexp is a vector
        if a.ndim >= 2:
            kind = next((v for k, v in (qtypes or {}).items() if name.endswith(k)), qtype)
            w.add_tensor(gname, _quantize_matrix(np.ascontiguousarray(a), kind), raw_dtype=gguf.GGMLQuantizationType[kind])
        else:
            w.add_tensor(gname, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_moe_metadata(w, c: dict) -> None:
    """The expert keys llama.cpp's converter writes for Qwen3-MoE / Qwen2-MoE."""
    w.add_expert_count(c.get("num_experts") or c["num_local_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_weights_norm(bool(c.get("norm_topk_prob", False)))
    if c.get("shared_expert_intermediate_size"):
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])


def _stack_experts(tensors: dict) -> dict:
    """HF's per-expert tensors of each layer as llama.cpp's stacks [E, rows, cols], under names
    ("model.layers.N.<ffn_*_exps>") that write_gguf passes through as blk.N.ffn_*_exps."""
    import re

    from rtp_llm.model_loader.gguf_moe import EXPERT_STACKS

    stacks, out = {}, {}
    for name, t in tensors.items():
        m = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)\.weight$", name)
        if m is None:
            out[name] = t
        else:
            stacks.setdefault((m[1], m[3]), {})[int(m[2])] = t
    gguf_name = {proj: rest for rest, proj in EXPERT_STACKS.items()}
    for (layer, proj), experts in stacks.items():
        out[f"model.layers.{layer}.{gguf_name[proj]}"] = torch.stack([experts[e] for e in sorted(experts)])
    return out


def requantize_gguf(src: str, dst: str, qtype: str = "Q8_0") -> str:
    """A copy of the GGUF file src (metadata, tokenizer and chat template included) with every
    quantized matrix dequantized and quantized again as `qtype` (gguf's own quantizer): a real
    model as, say, a Q8_0 file. Returns dst."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer's own
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub)
    kind = gguf.GGMLQuantizationType[qtype]
    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    for t in reader.tensors:
        if t.tensor_type in plain:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
            continue
        a = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w.add_tensor(t.name, gguf.quants.quantize(a, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


# ------------------------------------------------------------------ HF references

@functools.lru_cache(maxsize=1)
def hf_model(path: str, dtype=torch.float32, device: str = "cpu"):
    """HF transformers' model of an HF checkpoint directory or a .gguf file (dequantized), in
    eval mode, with EOS an ordinary token to its generate() like the engine's ignore_eos: the
    package's own loader (the offline benchmark's reference side). The last one made is kept
    and shared (read only: callers generate and score with it): consecutive test modules ask for
    the same reference, which takes a minute to load from a GGUF on 2 cores."""
    from rtp_llm.tools.bench_offline import load_hf

    return load_hf(path, dtype, device)


def hf_greedy(model, prompt, n: int):
    """HF's first n greedy tokens after `prompt` (token ids)."""
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(ids))
    return out[0, len(prompt):].tolist()


def hf_logprobs(model, ids) -> torch.Tensor:
    """HF's fp32 log-softmax at every position of `ids` (token ids): [len(ids), vocab], row i
    the distribution of the token after ids[:i + 1]."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=model.device)).logits[0]
    return torch.log_softmax(logits.float(), dim=-1).cpu()


def assert_prefill_logits_match_hf(path: str, hf, prompt, tol: float) -> None:
    """Our fp32 logits of `prompt`'s last position (its prefill step, run through the engine's
    runner) equal HF model `hf`'s within `tol` (absolute and relative)."""
    from rtp_llm.config.generate_config import GenerateConfig
    from rtp_llm.llm import LLM

    llm = LLM(path, act_type="fp32", progress=False, max_seq_len=256)
    try:
        sid = llm.engine.core.enqueue(prompt, GenerateConfig(max_new_tokens=1, temperature=0).to_proto())
        batch = llm.engine.core.schedule()
        ours = llm.engine.runner.logits(batch)[0]
        llm.engine.runner.step(llm.engine.core, batch)  # keeps the core consistent
        llm.engine.core.release(sid)
    finally:
        llm.close()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(ours, ref, atol=tol, rtol=tol)


PARITY_BATCH = random_prompts(11, [3, 17, 40, 9, 64])


def greedy_config(new_tokens: int) -> dict:
    return {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}


def fp32_greedy(path: str, batch, config: dict, **engine_args):
    """Our fp32 greedy token ids of `batch` on `path` (an LLM made and closed for the call)."""
    from rtp_llm.llm import LLM

    llm = LLM(path, act_type="fp32", progress=False, max_seq_len=256, **engine_args)
    try:
        return [o.outputs[0].token_ids for o in llm.generate(batch, config)]
    finally:
        llm.close()


class TinyHfFixtures:
    """A TestCase mixin: setUpClass writes the tiny fixtures FIXTURES (make_tiny), loads their
    HF models (cls.hf) and HF's greedy tokens of PARITY_BATCH (cls.ref); NEW_TOKENS of each.
    Its tests: our fp32 greedy tokens equal HF's (whole prompts and chunks of 16), prefill logits
    within 1e-4."""

    FIXTURES = ()
    NEW_TOKENS = 32

    @classmethod
    def setUpClass(cls):
        import tempfile

        cls.tmp = tempfile.TemporaryDirectory()
        cls.paths = {name: make_tiny(name, cls.tmp.name) for name in cls.FIXTURES}
        cls.hf = {name: hf_model(path) for name, path in cls.paths.items()}
        cls.ref = {name: [hf_greedy(cls.hf[name], p, cls.NEW_TOKENS) for p in PARITY_BATCH] for name in cls.FIXTURES}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_greedy_tokens_equal_hf(self):
        from rtp_llm.test.greedy_ties import assert_greedy_equal_up_to_ties  # (bazel's tests only, as kquants)

        for name in self.FIXTURES:
            for args in ({}, {"max_num_batched_tokens": 16}):  # whole prompts, then chunks of 16
                with self.subTest(name, **args):
                    ours = fp32_greedy(self.paths[name], PARITY_BATCH, greedy_config(self.NEW_TOKENS), **args)
                    assert_greedy_equal_up_to_ties(self, self.hf[name], PARITY_BATCH, ours, self.ref[name],
                                                   hf_logprobs)

    def test_prefill_logits_match(self):
        for name in self.FIXTURES:
            with self.subTest(name):
                assert_prefill_logits_match_hf(self.paths[name], self.hf[name], random_prompts(6, [37])[0], 1e-4)


def assert_prefix_cache_and_preemption_match_hf(test, path: str, hf, config: dict, num_kv_blocks: int) -> None:
    """fp32 greedy tokens of `path` equal HF's (`hf`) with `config`: four prompts sharing a
    48-token prefix (the later three reuse it from the prefix cache), then five streams growing in
    a cache of num_kv_blocks blocks of 16, small enough that they are preempted, in turn and
    overlapped (overlapped steps wait rather than preempt, so the cache must be short enough
    for those too)."""
    from rtp_llm.llm import LLM

    n = config["max_new_tokens"]
    batch = random_prompts(4, [5, 11, 20], prefix=random_prompts(3, [48])[0])
    llm = LLM(path, act_type="fp32", progress=False, max_seq_len=256)
    try:
        outs = llm.generate(batch[:1], config) + llm.generate(batch[1:], config)
        test.assertEqual([o.outputs[0].token_ids for o in outs], [hf_greedy(hf, p, n) for p in batch])
        test.assertTrue(all(o.aux_info["reuse_len"] >= 48 for o in outs[1:]), [o.aux_info for o in outs])
    finally:
        llm.close()
    batch = random_prompts(5, [30, 36, 25, 40, 31])
    ref = [hf_greedy(hf, p, n) for p in batch]
    for overlap in (False, True):
        with test.subTest(overlap=overlap):
            llm = LLM(path, act_type="fp32", progress=False, max_seq_len=256, num_kv_blocks=num_kv_blocks,
                      warm_up=False, overlap_schedule=overlap)
            try:
                test.assertEqual([o.outputs[0].token_ids for o in llm.generate(batch, config)], ref)
                test.assertGreater(llm.engine.core.stats()["preemptions"], 0)
            finally:
                llm.close()


def hf_tokenizer(path: str):
    """The tokenizer of an HF checkpoint directory or a .gguf file."""
    from transformers import AutoTokenizer

    if path.endswith(".gguf"):
        return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    return AutoTokenizer.from_pretrained(path)


# ------------------------------------------------------------------ servers

SERVER_DEFAULTS = ("--kv_cache_mem_mb=256", "--max_seq_len=2048", "--act_type=fp32")
HEALTHY_WITHIN_S = 300


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port() -> int:
    """A free TCP port below 65000 whose next few are free too: the server listens on
    start_port (HTTP), start_port + 1 (gRPC), with TP start_port + 3 (the ranks' rendezvous), and
    with --role_type start_port + 5 (the KV transfer's listener)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65000 and all(_bindable(port + i) for i in (1, 2, 3, 4, 5)):
            return port


def server_argv(model: str, port: int, *flags) -> list:
    """The command line of rtp_llm.start_server on `model` at HTTP port `port`."""
    return [sys.executable, "-m", "rtp_llm.start_server", f"--checkpoint_path={model}", f"--start_port={port}",
            *flags]


def start_server(model: str, *flags, frontends: int = 2, env=None):
    """(process, base URL) of a server that answers /health; `flags` add to or override the
    defaults (argparse keeps the last)."""
    port = free_port()
    proc = subprocess.Popen(server_argv(model, port, f"--frontend_server_count={frontends}", *SERVER_DEFAULTS,
                                        *flags), env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + HEALTHY_WITHIN_S
    while time.time() < deadline:
        assert proc.poll() is None, "the server exited while starting"
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, base
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(1)
    proc.kill()
    raise AssertionError("the server did not become healthy")


def stop_server(proc, timeout: float = 60) -> int:
    """SIGTERM (the launcher drains and stops its children), then the exit status."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=timeout)


def post_json(url: str, body, timeout: float = 120, headers=None):
    """(status, body text) of a JSON POST; HTTP errors are answers, not exceptions."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# ------------------------------------------------------------------ SSE

def sse_events(text: str):
    """The events of a whole SSE body, as sent: the native API frames them "data:<json>" (no
    space) and ends with "data:[done]"; the OpenAI API frames them "data: <json>"."""
    return [event for event in text.split("\n\n") if event]


def sse_payload(event: str) -> str:
    """An event's payload, whichever framing."""
    return event.partition(":")[2].strip()
