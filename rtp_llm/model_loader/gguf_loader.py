"""GGUF checkpoints (llama.cpp): architecture from the metadata, tensors with HF names,
llama.cpp's rotary permutation of q/k undone for llama-arch files, and the tokenizer (with its
chat template) built from the same file.

Tensors are dequantized to the run dtype, except Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K
projection weights (q/k/v/o, gate/up/down, an untied LM head) and embedding tables in a run dtype
other than fp32: those stay in the file's blocks (quantized.KEPT_FORMATS) for the backend to
compute on (the CPU's 32-block and k-quant kernels; the lookup widens only the rows it reads, a
tied LM head packs the table) or widen. fp32 runs widen everything: they are the exact reference.
Other quantized types (Q2_K, Q3_K, IQ*, ...) are widened, and so are a mixture-of-experts
file's router, experts and shared expert (gguf_moe.py: qwen3moe and qwen2moe) and, in DeepSeek's
deepseek2 files, the latent attention's projections too (gguf_deepseek.py: absorbed per head, they
take float weights); there attn_output, the dense layers' MLP and the embeddings may stay quantized."""

import hashlib
import logging
import os
import shutil
import tempfile
from typing import Dict, Optional, Union

import numpy as np
import torch
from tqdm import tqdm

from rtp_llm.config.model_config import ModelConfig, RopeScaling
from rtp_llm.model_loader.gguf_deepseek import ARCH, DeepseekTensors, deepseek_config_fields
from rtp_llm.model_loader.gguf_file import GGUFFile
from rtp_llm.model_loader.gguf_moe import EXPERT_STACKS, MOE_LAYER_NAMES, gguf_moe, moe_layer_tensor, split_experts
from rtp_llm.model_loader.quantized import QuantizedTensor, kept_format
from rtp_llm.model_loader.registry import MODEL_TYPES, resolve_model_type
from rtp_llm.model_loader.weights import CheckpointError, check_weights, pack_experts

log = logging.getLogger(__name__)

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}


def _reader(path: str) -> GGUFFile:
    try:
        return GGUFFile(path)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read GGUF file {path}: {e}") from e


def _field(reader: GGUFFile, key: str, default=None):
    return reader.fields.get(key, default)


def _required(reader: GGUFFile, key: str, path: str) -> int:
    value = reader.fields.get(key)
    if value is None:
        raise CheckpointError(f"{path}: {key} is missing (every GGUF model needs it)")
    return int(value)


def read_gguf_config(path: str, model_type: Optional[str] = None, reader: Optional[GGUFFile] = None) -> ModelConfig:
    reader = reader or _reader(path)
    arch = _field(reader, "general.architecture")
    name = resolve_model_type(model_type, arch, path)
    traits = MODEL_TYPES[name]
    a = arch
    num_layers = _required(reader, f"{a}.block_count", path)
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    if traits["mla"]:  # DeepSeek's latent attention, routing and yarn: gguf_deepseek.py
        if arch != ARCH:
            raise CheckpointError(f"{path}: {name} is read from llama.cpp's {ARCH} GGUF files, not {arch!r} ones")
        fields = deepseek_config_fields(lambda key: _field(reader, key), shapes, num_layers, path)
    else:
        moe = gguf_moe(lambda key: _field(reader, key), a, name, shapes, num_layers, traits["shared_expert"],
                       path) if traits["moe"] else None
        fields = dict(model_type=name, qkv_bias=traits["qkv_bias"], qk_norm=traits["qk_norm"], moe=moe,
                      **_common_fields(reader, a, path))
    eos = [int(_field(reader, k)) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
           if _field(reader, k) is not None]
    config = ModelConfig(
        vocab_size=len(_field(reader, "tokenizer.ggml.tokens", ())),
        hidden_size=_required(reader, f"{a}.embedding_length", path),
        num_layers=num_layers,
        rope_theta=float(_field(reader, f"{a}.rope.freq_base", 10000.0)),
        max_position_embeddings=int(_field(reader, f"{a}.context_length", 4096)),
        tie_word_embeddings="output.weight" not in shapes,
        eos_token_ids=sorted(set(eos)),
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        **fields,
    )
    config.validate()
    return config


def _common_fields(reader: GGUFFile, a: str, path: str) -> dict:
    """The attention, MLP and rope fields of the dense / Qwen-MoE architectures."""
    heads = int(_field(reader, f"{a}.attention.head_count"))
    hidden = int(_field(reader, f"{a}.embedding_length"))
    scale_type = _field(reader, f"{a}.rope.scaling.type", "none")
    if scale_type not in ("none", "linear"):
        raise CheckpointError(f"{path}: rope scaling {scale_type!r} is not supported")
    scaling = RopeScaling()
    if scale_type == "linear":
        scaling = RopeScaling(kind="linear", factor=float(_field(reader, f"{a}.rope.scaling.factor")))
    return dict(
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{a}.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, f"{a}.attention.key_length", hidden // heads)),
        intermediate_size=int(_field(reader, f"{a}.feed_forward_length")),
        rms_norm_eps=float(_field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_scaling=scaling,
    )


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    # llama.cpp's converter interleaves each head's rotary halves; restore HF's layout.
    out, hidden = w.shape
    return w.reshape(n_heads, out // n_heads // 2, 2, hidden).transpose(1, 2).reshape(out, hidden)


def _unpermute_rows(w: QuantizedTensor, n_heads: int) -> QuantizedTensor:
    # The same permutation as _unpermute, on whole rows of quantized blocks.
    index = _unpermute(torch.arange(w.shape[0])[:, None], n_heads)[:, 0]
    return w.permute_rows(index)


# Weights that may stay quantized (HF names' endings): projections and the embedding table;
# norms and biases are always widened.
_KEPT_QUANTIZED = ("_proj.weight", "lm_head.weight", "embed_tokens.weight")


def _kept_as(name: str, tensor_type, dtype: torch.dtype):
    """The quantized class this tensor is kept in, or None (widened)."""
    if dtype == torch.float32 or not name.endswith(_KEPT_QUANTIZED):
        return None
    return kept_format(tensor_type.name)


def _unpermute_bias(b: torch.Tensor, n_heads: int) -> torch.Tensor:
    return b.reshape(n_heads, b.shape[0] // n_heads // 2, 2).transpose(1, 2).reshape(-1)


def _widened(path: str, t) -> torch.Tensor:
    """A GGUF tensor dequantized to fp32, in HF's dimension order (a writable copy)."""
    import gguf

    try:
        data = gguf.quants.dequantize(t.data, t.tensor_type)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot dequantize tensor {t.name} ({t.tensor_type.name}): {e}") from e
    return torch.from_numpy(np.array(data, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)]))


def _moe_tensors(path: str, t, layer: str, rest: str, dtype: torch.dtype):
    """(HF name, tensor) pairs of a MoE layer tensor, widened to dtype (gguf_moe.py)."""
    tensor = _widened(path, t).to(dtype)
    if rest in EXPERT_STACKS:
        return split_experts(layer, rest, tensor)
    return [moe_layer_tensor(layer, rest, tensor)]


def load_gguf(path: str, model_type: Optional[str], dtype: torch.dtype, progress: bool = True):
    """(ModelConfig, weights) from a .gguf file."""
    reader = _reader(path)
    config = read_gguf_config(path, model_type, reader)
    permuted = _field(reader, "general.architecture") == "llama"
    deepseek = DeepseekTensors(config, dtype, path) if config.mla is not None else None
    weights: Dict[str, Union[torch.Tensor, QuantizedTensor]] = {}
    for t in tqdm(reader.tensors, desc="loading weights", unit="tensor", disable=not progress):
        if t.name.startswith("blk."):
            _, layer, rest = t.name.split(".", 2)
            if deepseek is not None and deepseek.takes(rest):  # (before the common names: attn_q is MLA's)
                weights.update(deepseek.convert(int(layer), rest, _widened(path, t)))
                continue
            if rest in EXPERT_STACKS or rest in MOE_LAYER_NAMES:
                weights.update(_moe_tensors(path, t, layer, rest, dtype))
                continue
            if rest not in _LAYER_NAMES:
                continue
            name = f"model.layers.{layer}.{_LAYER_NAMES[rest]}"
        elif t.name in _GLOBAL_NAMES:
            name = _GLOBAL_NAMES[t.name]
        else:
            continue
        shape = [int(d) for d in reversed(t.shape)]
        kept = _kept_as(name, t.tensor_type, dtype)
        if kept is not None:
            try:  # (the embedding table stays in the file's memory map: its lookup reads a few rows)
                q = kept.from_gguf(t.data, shape, dtype, copy=name != "model.embed_tokens.weight")
            except ValueError as e:
                raise CheckpointError(f"{path}: tensor {t.name}: {e}") from e
            if permuted and name.endswith(("q_proj.weight", "k_proj.weight")):
                q = _unpermute_rows(q, config.num_heads if "q_proj" in name else config.num_kv_heads)
            weights[name] = q
            continue
        tensor = _widened(path, t)
        if permuted and name.endswith(("q_proj.weight", "k_proj.weight")):
            tensor = _unpermute(tensor, config.num_heads if "q_proj" in name else config.num_kv_heads)
        if permuted and name.endswith(("q_proj.bias", "k_proj.bias")):
            tensor = _unpermute_bias(tensor, config.num_heads if "q_proj" in name else config.num_kv_heads)
        weights[name] = tensor.to(dtype)
    if deepseek is not None:
        weights.update(deepseek.finish())
    check_weights(config, weights, path)
    if config.moe is not None:
        pack_experts(config, weights)
    reader.release_pages()  # every other tensor was copied or widened: their pages need not stay mapped
    return config, weights


def load_gguf_tokenizer(path: str):
    """transformers' tokenizer converted from the file's vocabulary, cached: the conversion parses
    the whole header twice through gguf-py (~25 s for a Qwen vocabulary on 2 cores, in every
    process that serves the file: the backend and each frontend), so the first one is saved
    (save_pretrained) under a key of the file's path, size and mtime and transformers' version,
    and later loads read that. No cache where it cannot be written."""
    from transformers import AutoTokenizer

    cached = _tokenizer_cache(path)
    if cached is not None and os.path.isdir(cached):
        try:
            return AutoTokenizer.from_pretrained(cached)
        except Exception as e:  # (a cache another version left unreadable: convert again)
            log.warning("ignoring the cached tokenizer %s of %s: %s", cached, path, e)
    try:
        tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                                  gguf_file=os.path.basename(path))
    except Exception as e:
        fields = GGUFFile(path).fields
        if fields.get("general.architecture") != ARCH:
            raise CheckpointError(f"cannot build the tokenizer from {path}: {e}") from e
        tokenizer = _vocabulary_tokenizer(path, fields, e)
    if cached is not None:
        _save_tokenizer(tokenizer, cached)
    return tokenizer


def _vocabulary_tokenizer(path: str, fields: dict, auto_error: Exception):
    """The tokenizer of a deepseek2 file, which transformers' GGUF config reader does not know
    (AutoTokenizer reads the model config first): built from the vocabulary alone
    (tokenizer.ggml.model's byte-level BPE or sentencepiece builder), as AutoTokenizer's own
    tokenizer class does once it has one. fields: the file's metadata."""
    from transformers import PreTrainedTokenizerFast

    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                                            gguf_file=os.path.basename(path))
    except Exception as e:
        raise CheckpointError(f"cannot build the tokenizer from {path}: {auto_error}; from its vocabulary alone: "
                              f"{e}") from auto_error
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    except ImportError:
        return tokenizer
    pre = fields.get("tokenizer.ggml.pre")
    if fields.get("tokenizer.ggml.model") == "gpt2" and pre is not None and pre not in GGUF_PRE_TOKENIZER_SPLITS:
        log.warning("%s: transformers has no split rule for pre-tokenizer %r: text is split by GPT-2's byte-level "
                    "rule, which may tokenize some text otherwise than the model's own tokenizer (pass "
                    "--tokenizer_path to use that)", path, pre)
    return tokenizer


def _tokenizer_cache(path: str) -> Optional[str]:
    import transformers

    try:
        st = os.stat(path)
    except OSError:
        return None
    key = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}"
    root = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "rtp_llm", "gguf_tokenizers")
    return os.path.join(root, hashlib.sha256(key.encode()).hexdigest()[:32])


def _save_tokenizer(tokenizer, cached: str):
    """Written to a directory of its own, then renamed into place: processes converting the same
    file at once (a server's frontends) each write whole copies, and the first rename wins."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(cached), prefix=".tmp-")
        tokenizer.save_pretrained(tmp)
        os.rename(tmp, cached)  # (fails where another process's copy is already in place)
        tmp = None
    except Exception as e:  # serving goes on without the cache
        log.debug("tokenizer not cached at %s (%s)", cached, e)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
