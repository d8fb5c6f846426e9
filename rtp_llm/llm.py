"""Offline batch generation, in the spirit of vLLM's LLM.generate and upstream's pipeline.

    from rtp_llm.llm import LLM
    llm = LLM("path/to/checkpoint")            # HF directory or .gguf file
    out = llm.generate(["The capital of France is"], {"max_new_tokens": 8, "temperature": 0})
    print(out[0].outputs[0].text)
"""

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from rtp_llm.async_decoder_engine.engine import EngineArgs, EngineLoop
from rtp_llm.config.generate_config import GenerateConfig
from rtp_llm.config import quantization as quantization_flag
from rtp_llm.model_loader import load_model, parse_dtype
from rtp_llm.ops.engine_core import EngineError, decode_output

log = logging.getLogger(__name__)

Prompt = Union[str, Sequence[int]]


@dataclass
class SequenceOutput:
    token_ids: List[int]
    text: Optional[str]
    finish_reason: str  # "stop" | "length" (as the core decided) | "error: ..."
    logprobs: Optional[List[float]] = None
    # With top_logprobs k: per token, its k best alternatives [(token id, log-prob)], best first.
    top_logprobs: Optional[List[List[Tuple[int, float]]]] = None


@dataclass
class GenerationOutput:
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[SequenceOutput]
    aux_info: Dict[str, Any] = field(default_factory=dict)


class LLM:
    """tp_size > 1 runs the model tensor-parallel: this process is rank 0 (core, sampling) and
    spawns tp_size - 1 rank processes on this node (one GPU each with device="cuda")."""

    def __init__(self, checkpoint_path: str, model_type: Optional[str] = None, tokenizer_path: Optional[str] = None,
                 act_type: str = "fp32", progress: bool = True, tp_size: int = 1,
                 dist_timeout_s: Optional[int] = None, quantization: Optional[str] = None, load_format: str = "auto",
                 **engine_args):
        from rtp_llm.distributed.launch import set_rank_device, spawn_workers
        from rtp_llm.distributed.tensor_parallel import ParallelConfig, free_port, init_tensor_parallel

        self._workers = []
        tp = None
        quantization = quantization_flag.scheme(quantization)
        quantization_flag.check(quantization, EngineArgs(**engine_args).device, act_type)
        if tp_size > 1:
            # (dist_timeout_s None: ParallelConfig's default)
            timeout = {} if dist_timeout_s is None else {"dist_timeout_s": dist_timeout_s}
            parallel = ParallelConfig(tp_size=tp_size, world_size=tp_size, local_world_size=tp_size,
                                      master_port=free_port(), **timeout)
            load_args = dict(checkpoint_path=checkpoint_path, model_type=model_type, act_type=act_type,
                             tokenizer_path=tokenizer_path, quantization=quantization, load_format=load_format)
            self._workers = spawn_workers(load_args, engine_args, parallel)
            tp = init_tensor_parallel(parallel, set_rank_device(EngineArgs(**engine_args).device, parallel))
        self.loaded = load_model(checkpoint_path, model_type, parse_dtype(act_type), tokenizer_path, progress,
                                 quantization, load_format, device=EngineArgs(**engine_args).device)
        self.tokenizer = self.loaded.tokenizer
        self.engine = EngineLoop(self.loaded, EngineArgs(**engine_args), tp)

    def encode(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer: pass token ids, or tokenizer_path")
            return list(self.tokenizer(prompt).input_ids)
        return [int(t) for t in prompt]

    def generate(self, prompts: Union[Prompt, List[Prompt]],
                 generate_config: Union[None, Dict[str, Any], List[Dict[str, Any]]] = None) -> List[GenerationOutput]:
        single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], int))
        prompts = [prompts] if single else list(prompts)
        configs = generate_config if isinstance(generate_config, list) else [generate_config] * len(prompts)
        if len(configs) != len(prompts):
            raise ValueError(f"{len(configs)} generate_configs for {len(prompts)} prompts")
        core = self.engine.core
        pending = []  # (prompt index, sequence index, stream id)
        encoded, parsed = [], []
        try:
            for i, (prompt, cfg) in enumerate(zip(prompts, configs)):
                gc = GenerateConfig.from_dict(cfg)
                ids = self.encode(prompt)
                encoded.append(ids)
                parsed.append(gc)
                for j in range(gc.num_return_sequences):
                    pending.append((i, j, core.enqueue(ids, gc.to_proto(j), request_id=i)))
            while self.engine.step():
                pass
            results = [GenerationOutput(p if isinstance(p, str) else None, ids, []) for p, ids in zip(prompts, encoded)]
            for i, j, sid in pending:
                out, code = core.poll(sid)
                d = decode_output(out)
                reason = f"error: {out.error_info.error_message} ({code})" if code != 0 else d.finish_reason
                logprobs = d.logprobs if parsed[i].return_logprobs else None
                results[i].outputs.append(SequenceOutput(d.token_ids, self._decode(d.token_ids), reason, logprobs,
                                                         d.top_logprobs))
                results[i].aux_info = d.aux
            return results
        finally:
            for _, _, sid in pending:
                core.release(sid)

    def _decode(self, ids: List[int]) -> Optional[str]:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def close(self):
        self.engine.close()  # tells the other ranks to stop
        for p in self._workers:
            p.join(60)
        if self._workers:
            import torch.distributed as dist

            dist.destroy_process_group()
            self._workers = []


__all__ = ["LLM", "GenerationOutput", "SequenceOutput", "EngineError"]
