"""Upstream RTP-LLM's generate_config keys (its rtp_llm/config/generate_config.py, 2026-12) on the
native API. Each is in exactly one place: an engine field of ours (GenerateConfig), a frontend
option (frontend/request.py NATIVE_OPTIONS: stop strings, streaming, output ids, log-prob sums,
and the translated do_sample / eos_token_id / bad_words_list), or one of the two tables here:
IGNORED (they steer upstream's own infrastructure; accepted, no effect) and REFUSED (they ask for
what this engine cannot do: accepted at a value that asks for nothing, else a 400 naming the key).
A key in none of them stays a 400 (unknown field). UNSET: upstream's "not set" values of keys we
have with a narrower range, dropped before validation."""

from typing import Any, Callable, Dict, Tuple

UPSTREAM_KEYS = (
    "max_new_tokens", "max_input_tokens", "max_thinking_tokens", "in_think_mode", "chat_template_kwargs",
    "end_think_token_ids", "num_beams", "variable_num_beams", "do_sample", "num_return_sequences", "top_k", "top_p",
    "temperature", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_new_tokens",
    "no_repeat_ngram_size", "random_seed", "top_p_decay", "top_p_min", "top_p_reset_ids", "stop_words_str",
    "stop_words_list", "bad_words_list", "eos_token_id", "pad_token_id", "bos_token_id", "using_hf_sampling",
    "print_stop_words", "timeout_ms", "ttft_timeout_ms", "traffic_reject_priority", "chat_id", "task_id",
    "request_format", "calculate_loss", "return_logits", "logits_index", "return_incremental", "return_hidden_states",
    "return_all_hidden_states", "hidden_states_cut_dim", "normalized_hidden_states", "select_tokens_str",
    "select_tokens_id", "return_input_ids", "return_output_ids", "md5_value", "custom_prop", "sp_advice_prompt",
    "sp_advice_prompt_token_ids", "sp_edit", "force_disable_sp_run", "force_sp_accept", "return_cum_log_probs",
    "return_all_probs", "return_softmax_probs", "can_use_pd_separation", "gen_timeline", "profile_step", "out_prefix",
    "role_addrs", "trace_id", "inter_request_id", "ignore_eos", "skip_special_tokens", "adapter_name", "is_streaming",
    "resized_shape", "add_vision_id", "tool_call_message_extract_strategy", "global_request_id", "reuse_cache",
    "enable_memory_block_cache", "enable_remote_cache", "enable_device_cache", "sync_wait_write",
)

# key: why it changes nothing here
IGNORED: Dict[str, str] = {
    **{k: "request bookkeeping of upstream's frontend and logs" for k in (
        "chat_id", "task_id", "trace_id", "inter_request_id", "global_request_id", "md5_value", "custom_prop",
        "request_format", "out_prefix")},
    **{k: "upstream's load balancing and traffic control" for k in ("role_addrs", "traffic_reject_priority")},
    "can_use_pd_separation": "a PREFILL instance (--role_type) hands every request it can to its DECODE instance",
    **{k: "upstream's cache tiers; the prefix cache is the server's --reuse_cache" for k in (
        "reuse_cache", "enable_memory_block_cache", "enable_remote_cache", "enable_device_cache", "sync_wait_write")},
    **{k: "upstream's profiling" for k in ("gen_timeline", "profile_step")},
    "max_input_tokens": "upstream's Qwen-agent function-call check; the prompt is fitted to the context instead",
    "pad_token_id": "one sequence per stream: nothing is padded",
    "bos_token_id": "the tokenizer and chat template add BOS",
    "using_hf_sampling": "one sampler, HF's semantics for the penalties",
    "hidden_states_cut_dim": "hidden states are not returned (return_hidden_states is refused)",
    "normalized_hidden_states": "hidden states are not returned (return_hidden_states is refused)",
    "add_vision_id": "no multimodal models",
    "resized_shape": "no multimodal models",
    "tool_call_message_extract_strategy": "tool calls are parsed on /v1/chat/completions (--tool_call_parser)",
}


def _none(v) -> bool:
    return v is None


def _false(v) -> bool:
    return v is None or v is False


def _empty(v) -> bool:
    return v is None or v == [] or v == ""


def _at_most(n: int) -> Callable[[Any], bool]:
    return lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v <= n)


def _no_beams(v) -> bool:
    return v is None or (isinstance(v, list) and all(isinstance(b, int) and b <= 1 for b in v))


# key: (whether a value asks for nothing, what this engine cannot do)
REFUSED: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "num_beams": (_at_most(1), "beam search is not implemented (num_beams must be 1)"),
    "variable_num_beams": (_no_beams, "beam search is not implemented"),
    "top_p_decay": (_none, "top-p decay is not implemented"),
    "top_p_min": (_none, "top-p decay is not implemented"),
    "top_p_reset_ids": (_none, "top-p decay is not implemented"),
    "ttft_timeout_ms": (_at_most(0), "a time-to-first-token timeout is not implemented; use timeout_ms"),
    "calculate_loss": (_at_most(0), "the loss is not returned"),
    "return_logits": (_false, "logits are not returned; use top_logprobs"),
    "logits_index": (_none, "logits are not returned; use top_logprobs"),
    "return_hidden_states": (_false, "hidden states are not returned"),
    "return_all_hidden_states": (_false, "hidden states are not returned"),
    "select_tokens_str": (_empty, "logits of selected tokens are not returned; use top_logprobs"),
    "select_tokens_id": (_empty, "logits of selected tokens are not returned; use top_logprobs"),
    "return_all_probs": (_false, "the whole distribution is not returned; use top_logprobs"),
    "sp_advice_prompt": (_empty, "speculative decoding is not implemented"),
    "sp_advice_prompt_token_ids": (_empty, "speculative decoding is not implemented"),
    "sp_edit": (_false, "speculative decoding is not implemented"),
    "force_sp_accept": (_false, "speculative decoding is not implemented"),
    "adapter_name": (_empty, "LoRA adapters are not implemented"),
}

# key: upstream's default meaning "not set", where our range leaves it out
UNSET: Dict[str, Any] = {"timeout_ms": -1, "num_return_sequences": 0}
