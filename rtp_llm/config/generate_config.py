"""Per-request generation settings (upstream's generate_config names) and their proto form."""

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional

from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2 as pb


class GenerateConfigError(ValueError):
    """A bad generate_config; `field` names the key at fault."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"generate_config.{field_name}: {message}")
        self.field = field_name


@dataclass
class GenerateConfig:
    max_new_tokens: int = 256
    min_new_tokens: int = 0
    num_return_sequences: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    random_seed: Optional[int] = None
    ignore_eos: bool = False
    stop_words_list: List[List[int]] = field(default_factory=list)
    return_logprobs: bool = False
    timeout_ms: int = 0

    @classmethod
    def from_dict(cls, d: Optional[Dict[str, Any]]) -> "GenerateConfig":
        d = dict(d or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(k for k in d if k not in known)
        if unknown:
            raise GenerateConfigError(unknown[0], f"unknown field (known: {', '.join(sorted(known))})")
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        def need(ok: bool, name: str, what: str):
            if not ok:
                raise GenerateConfigError(name, f"{what}, got {getattr(self, name)!r}")

        for name in ("max_new_tokens", "min_new_tokens", "num_return_sequences", "top_k", "timeout_ms"):
            need(isinstance(getattr(self, name), int) and not isinstance(getattr(self, name), bool), name,
                 "must be an integer")
        need(self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
        need(self.min_new_tokens >= 0, "min_new_tokens", "must be >= 0")
        need(1 <= self.num_return_sequences <= 64, "num_return_sequences", "must be in [1, 64]")
        need(self.temperature >= 0, "temperature", "must be >= 0")
        need(self.top_k >= 0, "top_k", "must be >= 0")
        need(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        need(0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        need(self.repetition_penalty > 0, "repetition_penalty", "must be > 0")
        need(self.timeout_ms >= 0, "timeout_ms", "must be >= 0")
        need(self.random_seed is None or (isinstance(self.random_seed, int) and self.random_seed >= 0),
             "random_seed", "must be a non-negative integer")
        need(all(isinstance(w, list) and w and all(isinstance(t, int) for t in w) for w in self.stop_words_list),
             "stop_words_list", "must be a list of non-empty token id lists")

    def to_proto(self, sequence_index: int = 0) -> pb.GenerateConfigPB:
        c = pb.GenerateConfigPB(
            max_new_tokens=self.max_new_tokens, min_new_tokens=self.min_new_tokens, top_k=self.top_k,
            top_p=self.top_p, min_p=self.min_p, temperature=self.temperature,
            repetition_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, ignore_eos=self.ignore_eos, timeout_ms=self.timeout_ms,
            return_softmax_probs=self.return_logprobs, num_return_sequences=1,
        )
        if self.random_seed is not None:
            # Sequence i of num_return_sequences draws from its own seed.
            c.random_seed.value = self.random_seed + sequence_index
        for words in self.stop_words_list:
            c.stop_words_list.rows.add(values=words)
        return c
