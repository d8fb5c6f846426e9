"""Loads a checkpoint (HF directory or .gguf file) into a ModelConfig, named tensors in the run
dtype, and a tokenizer."""

import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import torch

from rtp_llm.config.model_config import LOAD_FORMATS, ModelConfig
from rtp_llm.model_loader.registry import MODEL_TYPES, UnsupportedModelError  # noqa: F401
from rtp_llm.model_loader.weights import CheckpointError

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


@dataclass
class LoadedModel:
    """tokenizer: None when the checkpoint has none, or when it was not loaded (load_model's
    tokenizer=False: a process that encodes nothing, a server's backend) or dropped;
    reload_tokenizer loads it (None: the checkpoint has none)."""

    config: ModelConfig
    weights: Dict[str, torch.Tensor]
    tokenizer: Any
    dtype: torch.dtype
    reload_tokenizer: Optional[Callable[[], Any]] = None
    load_format: str = "auto"  # load_model's: a draft model is loaded the same way (draft_model.load_draft)
    checkpoint_path: str = ""  # where it came from (a multi-token-prediction layer is read from it too: mtp.py)

    def tokenizer_source(self) -> Optional[Callable[[], Any]]:
        """What the engine's grammar compiler calls at its first grammar: the tokenizer held here,
        or else loaded then; None when the checkpoint has none."""
        if self.tokenizer is None and self.reload_tokenizer is None:
            return None
        return lambda: self.tokenizer if self.tokenizer is not None else self.reload_tokenizer()


def find_gguf(checkpoint_path: str) -> Optional[str]:
    if checkpoint_path.endswith(".gguf") and os.path.isfile(checkpoint_path):
        return checkpoint_path
    if os.path.isdir(checkpoint_path) and not os.path.exists(os.path.join(checkpoint_path, "config.json")):
        found = sorted(f for f in os.listdir(checkpoint_path) if f.endswith(".gguf"))
        if len(found) > 1:
            raise CheckpointError(f"{checkpoint_path} holds several .gguf files ({', '.join(found)}): name one")
        if found:
            return os.path.join(checkpoint_path, found[0])
    return None


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"act_type {name!r} is not supported; use one of {', '.join(sorted(DTYPES))}")
    return DTYPES[name]


def has_tokenizer(checkpoint_path: str, tokenizer_path: Optional[str] = None) -> bool:
    """Whether load_tokenizer finds one (an HF directory may hold token ids only)."""
    return bool(tokenizer_path) or find_gguf(checkpoint_path) is not None or any(
        os.path.exists(os.path.join(checkpoint_path, f)) for f in ("tokenizer.json", "tokenizer_config.json",
                                                                     "tokenizer.model"))


def load_tokenizer(checkpoint_path: str, tokenizer_path: Optional[str] = None):
    """The tokenizer for a checkpoint: tokenizer_path if given, else the GGUF file's, else the
    HF directory's; None when an HF directory has no tokenizer files (token ids only)."""
    if not has_tokenizer(checkpoint_path, tokenizer_path):
        return None
    if not tokenizer_path:
        gguf_path = find_gguf(checkpoint_path)
        if gguf_path:
            from rtp_llm.model_loader.gguf_loader import load_gguf_tokenizer

            return load_gguf_tokenizer(gguf_path)
        tokenizer_path = checkpoint_path
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(tokenizer_path)
    except Exception as e:
        raise CheckpointError(f"cannot load a tokenizer from {tokenizer_path}: {e}") from e


def load_model(checkpoint_path: str, model_type: Optional[str] = None, dtype: torch.dtype = torch.float32,
               tokenizer_path: Optional[str] = None, progress: bool = True,
               quantization: Optional[str] = None, load_format: str = "auto",
               tokenizer: bool = True, device: str = "cpu") -> LoadedModel:
    """quantization: a config/quantization.py scheme (None: the checkpoint's dtypes), checked by
    the caller against the device. load_format: "auto" (the checkpoint's files) or "dummy"
    (random weights of its config.json's shapes, made on `device` where it is a GPU: dummy.py).
    tokenizer=False: not loaded unless the config lacks EOS ids, which it then gives
    (LoadedModel.reload_tokenizer loads it)."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"--load_format must be one of {', '.join(LOAD_FORMATS)}, got {load_format!r}")
    if not os.path.exists(checkpoint_path):
        raise CheckpointError(f"checkpoint_path {checkpoint_path} does not exist")
    gguf_path = find_gguf(checkpoint_path)
    if load_format == "dummy":
        if gguf_path:
            raise ValueError(f"--load_format=dummy makes weights from an HF config.json; {gguf_path} is a GGUF file")
        from rtp_llm.model_loader.dummy import dummy_weights
        from rtp_llm.model_loader.hf_loader import read_hf_config

        config = read_hf_config(checkpoint_path, model_type)
        weights = dummy_weights(config, dtype, progress, device=device)
    elif gguf_path:
        from rtp_llm.model_loader.gguf_loader import load_gguf

        config, weights = load_gguf(gguf_path, model_type, dtype, progress)
    else:
        from rtp_llm.model_loader.hf_loader import load_hf_weights, read_hf_config

        config = read_hf_config(checkpoint_path, model_type)
        weights = load_hf_weights(checkpoint_path, config, dtype, progress)
    if quantization:
        from rtp_llm.model_loader.quantize_at_load import quantize_weights

        quantize_weights(weights, quantization, config, device)
    found = has_tokenizer(checkpoint_path, tokenizer_path)
    tok = load_tokenizer(checkpoint_path, tokenizer_path) if found and (tokenizer or not config.eos_token_ids) else None
    if not config.eos_token_ids and getattr(tok, "eos_token_id", None) is not None:
        config.eos_token_ids = [int(tok.eos_token_id)]
    reload = functools.partial(load_tokenizer, checkpoint_path, tokenizer_path) if found else None
    return LoadedModel(config, weights, tok if tokenizer else None, dtype, reload, load_format, checkpoint_path)
