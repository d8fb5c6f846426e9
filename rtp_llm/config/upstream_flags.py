"""Upstream RTP-LLM's launch flags this server does not implement, grouped as upstream groups
them, with what to do instead: parse_server_config refuses each by name (a flag in neither
ServerConfig nor this table stays argparse's error). Names as of upstream's server_args
(2026-12); a flag of ours with an upstream name is never here."""

from typing import Dict, Optional, Tuple

# group: (why, or what to use instead; the group's flags)
UPSTREAM_GROUPS: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "batch_decode_scheduler": ("the scheduler is sized by --max_batch_size and --max_num_batched_tokens",
        (
            "batch_decode_scheduler_batch_size", "batch_decode_scheduler_warmup_type"
        )),
    "cache_store": ("upstream's cache store is not ours: prefill/decode disaggregation (--role_type) moves KV blocks "
        "through the KV transfer engine (NIXL; docs/deploy.md)",
        (
            "cache_store_messager_io_thread_count", "cache_store_messager_worker_thread_count",
            "cache_store_rdma_connect_timeout_ms", "cache_store_rdma_io_thread_count",
            "cache_store_rdma_max_block_pairs_per_connection", "cache_store_rdma_mode",
            "cache_store_rdma_qp_count_per_connection", "cache_store_rdma_transfer_wait_timeout_ms",
            "cache_store_rdma_worker_thread_count", "cache_store_tcp_anet_rpc_queue_num",
            "cache_store_tcp_anet_rpc_thread_num", "cache_store_thread_count",
            "p2p_cancel_broadcast_timeout_ms", "p2p_layer_cache_buffer_store_timeout_ms",
            "p2p_read_return_before_deadline_ms", "p2p_read_steal_before_deadline_ms",
            "p2p_resource_store_timeout_check_interval_ms", "p2p_transfer_not_done_resource_hold_ms",
            "rank_factor", "wrr_available_ratio"
        )),
    "concurrent": ("admission is --concurrency_limit and --max_queue_size",
        (
            "concurrency_with_block",
        )),
    "device_resource": ("device memory is sized by --kv_cache_mem_mb",
        (
            "enable_comm_overlap", "enable_layer_micro_batch", "m_split", "overlap_comm_type",
            "overlap_math_sm_count", "reserver_runtime_mem_mb", "specify_gpu_arch"
        )),
    "embedding": ("embedding models are not implemented",
        (
            "embedding_model",
        )),
    "engine": ("the engine always warms up at start",
        (
            "model_warm_up", "warm_up", "warm_up_with_loss"
        )),
    "fifo_scheduler": ("the scheduler is sized by --max_batch_size and --max_num_batched_tokens",
        (
            "cp_force_single_prefill", "decode_prefill_ratio", "max_batch_tokens_size",
            "max_batch_tokens_without_cache", "max_context_batch_size", "max_inited_kv_cache_streams",
            "pdfusion_scheduler_mode"
        )),
    "fmha": ("attention kernels are chosen per device",
        (
            "absorb_opt_len", "disable_flashinfer_hybrid_prefill", "disable_flashinfer_native",
            "enable_flashinfer_trt_fmha_v2", "enable_flashinfer_trtllm_gen", "enable_fmha",
            "enable_open_source_fmha", "enable_paged_flashinfer_trt_fmha_v2", "enable_paged_open_source_fmha",
            "enable_xqa", "use_aiter_pa", "use_asm_pa", "use_triton_pa"
        )),
    "gang": ("upstream's gang launcher is not implemented: multi-node TP uses --world_rank, --local_world_size and "
        "--master_addr (docs/deploy.md)",
        (
            "dist_comm_timeout", "distribute_config_file", "fake_gang_env", "gang_annocation_path",
            "gang_config_string", "gang_sleep_time", "gang_timeout_min", "remote_server_port", "zone_name"
        )),
    "generate": ("stop strings and thinking tags are per request (stop, generate_config), or --reasoning_parser",
        (
            "force_stop_words", "generation_config_path", "stop_words_list", "stop_words_str", "think_end_tag",
            "think_end_token_id", "think_mode", "think_start_tag", "think_terminate_token_id"
        )),
    "grammar": ("grammars compile in the engine process (--grammar_num_workers, "
                "--grammar_admission_compile_timeout_s, --constrained_json_disable_any_whitespace)",
        (
            "grammar_admission_compiler_cache_bytes", "grammar_admission_queue_timeout_s",
            "grammar_admission_result_cache_max_entries", "grammar_admission_sandbox_pool_size",
            "grammar_admission_sandbox_process_memory_limit_mb", "grammar_compiler_cache_bytes",
            "grammar_terminate_without_stop_token"
        )),
    "grpc": ("the gRPC server has no tunables",
        (
            "dash_sc_grpc_config_json", "grpc_config_json"
        )),
    "hw_kernel": ("kernels are chosen per device; CUDA graphs: --cuda_graph",
        (
            "arm_gemm_use_kai", "decode_capture_config", "deep_gemm_num_sm", "disable_dpc_random",
            "enable_cuda_graph", "enable_cuda_graph_debug_mode", "enable_multi_block_mode",
            "enable_native_cuda_graph", "ft_disable_custom_ar", "num_native_cuda_graph",
            "prefill_capture_config", "rocm_disable_custom_ag", "rocm_hipblaslt_config"
        )),
    "jit": ("there is no JIT cache: the Triton kernels compile on first use",
        (
            "jit_cache_setup_timeout_s", "manage_jit_cache", "remote_jit_dir"
        )),
    "kv_cache": ("only the device KV cache and its prefix cache are implemented: --kv_cache_mem_mb, "
        "--seq_size_per_block, --reuse_cache",
        (
            "blockwise_use_fp8_kv_cache", "device_cache_min_free_blocks", "dsv4_fixed_pool_blocks",
            "dsv4_fixed_pool_use_memory", "dsv4_hca_state_pool_blocks", "enable_device_cache",
            "enable_dsv4_state_block_independent_eviction", "enable_gpu_prefix_tree",
            "enable_independent_group_eviction", "enable_legacy_memory_connector_fallback",
            "enable_memory_cache", "enable_memory_cache_disk", "enable_memory_cache_sm_copy",
            "enable_prefix_tree_memory_cache", "enable_remote_cache", "enable_tiered_memory_cache",
            "fp8_kv_cache", "kernel_seq_size_per_block", "linear_step", "memory_cache_disk_buffered_io",
            "memory_cache_disk_paths", "memory_cache_disk_size_mb", "memory_cache_disk_sync_timeout_ms",
            "memory_cache_size_mb", "memory_cache_sync_timeout_ms", "multi_task_prompt",
            "multi_task_prompt_str", "prefix_tree_memory_state_swa_pool_ratio", "reco_asyncwrapper_queue_size",
            "reco_asyncwrapper_thread_num", "reco_client_config", "reco_enable_vipserver",
            "reco_get_broadcast_timeout", "reco_get_timeout_ms", "reco_instance_group", "reco_instance_id_salt",
            "reco_meta_channel_call_timeout", "reco_meta_channel_connection_timeout",
            "reco_meta_channel_retry_time", "reco_model_extra_info", "reco_model_sdk_config",
            "reco_model_user_data", "reco_put_broadcast_timeout", "reco_put_timeout_ms", "reco_server_address",
            "reco_storage_queue_size", "reco_storage_thread_num", "reco_vipserver_domain",
            "reserve_block_ratio", "ssm_state_dtype", "test_block_num", "write_cache_sync"
        )),
    "load": ("weights load one way (safetensors or GGUF)",
        (
            "force_cpu_load_weights", "load_method", "loader_recycle_handles", "moe_pure_tp_preshard"
        )),
    "lora": ("LoRA adapters are not implemented",
        (
            "lora_info", "merge_lora"
        )),
    "master": ("upstream's master (request routing) is not implemented",
        (
            "master_default_timeout_ms", "master_max_connect_pool_size", "master_queue_reject_threshold",
            "master_session_timeout_s"
        )),
    "misc": ("not implemented",
        (
            "aux_string", "dashscope_api_key", "dashscope_http_url", "dashscope_websocket_url", "disable_pdl",
            "openai_api_key", "oss_endpoint"
        )),
    "model": ("model options beyond --checkpoint_path, --model_type, --tokenizer_path, --act_type and --max_seq_len "
        "are not implemented",
        (
            "enable_fp32_lm_head", "enable_output_vocab_pruning", "json_model_override_args", "mla_ops_type",
            "ptuning_path", "task_type"
        )),
    "model_specific": ("LoRA adapters are not implemented",
        (
            "max_lora_model_size",
        )),
    "moe": ("MoE models and expert parallelism are not implemented yet",
        (
            "balance_method", "deep_ep_num_sm", "eplb_balance_layer_per_step", "eplb_control_step",
            "eplb_force_repack", "eplb_mode", "eplb_stats_window_size", "eplb_test_mode", "eplb_update_time",
            "fake_balance_expert", "fp4_moe_op", "masked_max_token_num", "moe_strategy", "redundant_expert",
            "use_all_gather", "use_deepep_internode", "use_deepep_low_latency", "use_deepep_moe",
            "use_deepep_p2p_low_latency", "use_mori_ep"
        )),
    "parallel": ("only tensor parallelism is implemented: --tp_size, --world_size, --world_rank, --local_world_size",
        (
            "comm_buffer_size", "cp_rotate_method", "dp_size", "enable_ffn_disaggregate", "ep_size",
            "ffn_sp_size", "prefill_cp_kv_cache_sharded", "prefill_cp_size", "use_ub_comm"
        )),
    "pd_separation": ("upstream's PD retry and timeout tuning is not implemented: --role_type, "
        "--remote_rpc_server_ip and --kv_transfer_host configure disaggregation (docs/deploy.md)",
        (
            "decode_entrance", "decode_polling_kv_cache_step_ms", "decode_retry_interval_ms",
            "decode_retry_timeout_ms", "decode_retry_times", "load_cache_timeout_ms", "max_rpc_timeout_ms",
            "prefill_max_wait_timeout_ms", "prefill_prepare_resource_pool_size", "prefill_retry_timeout_ms",
            "prefill_retry_times", "prefill_stop_stream_wait_timeout_ms", "rdma_connect_retry_times"
        )),
    "profile_debug_logging": ("upstream's debug and profiling switches are not implemented",
        (
            "check_nan", "debug_load_server", "debug_start_fake_process", "enable_detail_log",
            "enable_device_perf", "enable_model_inputs_log", "ft_alog_conf_path", "ft_core_dump_on_exception",
            "gen_timeline_num_steps", "gen_timeline_start_step", "gen_timeline_sync", "gen_timeline_trace_name",
            "hack_layer_num", "torch_cuda_profiler_dir", "trace_memory"
        )),
    "render": ("the chat template is the tokenizer's",
        (
            "default_chat_template_key", "default_tool_use_template_key", "llava_chat_template",
            "model_template_type"
        )),
    "repetition_detection": ("tool-call loop detection is not implemented",
        (
            "tool_call_loop_begin_marker", "tool_call_loop_end_marker", "tool_call_loop_max_span_tokens",
            "tool_call_loop_monitor", "tool_call_loop_threshold"
        )),
    "rpc_discovery": ("upstream's service discovery is not implemented: a server is one node, or --tp_size ranks "
        "(docs/deploy.md)",
        (
            "decode_cm2_config", "multimodal_part_cm2_config", "remote_vit_server_ip",
            "use_local"
        )),
    "scheduler": ("the scheduler is sized by --max_batch_size and --max_num_batched_tokens",
        (
            "max_block_size_per_item", "use_batch_decode_scheduler"
        )),
    "server": ("the server is --start_port, --frontend_server_count and --host",
        (
            "backend_post_frontend_drain_seconds", "dash_sc_grpc_pre_stop_drain_seconds",
            "frontend_pre_stop_drain_seconds", "frontend_server_id", "monitor_interval",
            "pre_stop_drain_headroom_seconds", "pre_stop_drain_signal", "shutdown_timeout",
            "timeout_keep_alive", "vit_server_count", "vit_server_id", "worker_info_port_num"
        )),
    "speculative_decoding": ("prompt lookup, a draft model, an EAGLE-3 head and DeepSeek-V3's MTP layer are "
        "implemented (--sp_type=ngram, deterministic, vanilla, eagle3 or mtp, --gen_num_per_cycle, "
        "--sp_min_token_match, --sp_max_token_match, --sp_checkpoint_path, --sp_model_type; the drafter runs in "
        "the target's --act_type, unquantized): no EAGLE-1/2 or tree decoding yet",
        (
            "force_score_context_attention", "force_stream_sample", "sp_act_type", "sp_quantization",
            "tree_decode_config"
        )),
    "threefs": ("upstream's remote KV storage (3FS) is not implemented",
        (
            "enable_3fs", "max_block_size_per_item", "threefs_match_timeout_ms", "threefs_read_iov_size",
            "threefs_read_timeout_ms", "threefs_rpc_get_cache_timeout_ms", "threefs_rpc_put_cache_timeout_ms",
            "threefs_write_iov_size", "threefs_write_timeout_ms"
        )),
    "vit": ("multimodal models are not implemented",
        (
            "biencoder_preprocess", "disable_access_log", "download_headers", "extra_data_path",
            "extra_input_in_mm_embedding", "gpu_batch_wait_ms", "gpu_max_batch_images", "gpu_max_batch_size",
            "igraph_default_key", "igraph_search_dom", "igraph_table_name", "igraph_vipserver",
            "local_extra_data_path", "mm_cache_item_num", "mm_image_max_file_size_kb", "mm_max_queue_size",
            "mm_preprocess_max_workers", "mm_timeout_ms", "mm_video_max_file_size_kb", "trt_cache_enabled",
            "trt_cache_path", "url_cache_item_num", "use_igraph_cache", "use_local_preprocess",
            "vit_proxy_load_balance_strategy", "vit_separation", "vit_trt"
        )),
}

# Flags with a direct equivalent here.
INSTEAD: Dict[str, str] = {
    "max_batch_tokens_size": "--max_num_batched_tokens",
    "max_context_batch_size": "--max_batch_size",
    "enable_cuda_graph": "--cuda_graph",
    "reserver_runtime_mem_mb": "--kv_cache_mem_mb",
    "fp8_kv_cache": "--kv_cache_dtype=fp8",
    "blockwise_use_fp8_kv_cache": "--kv_cache_dtype=fp8 (per-tensor scale 1, not per block)",
    "stop_words_str": "the request's stop or generate_config.stop_words_str",
    "stop_words_list": "generate_config.stop_words_list",
}


def unsupported_upstream_flag(name: str) -> Optional[str]:
    """Why upstream's flag --`name` is refused here; None for a name upstream does not have."""
    for group, (why, names) in UPSTREAM_GROUPS.items():
        if name in names:
            instead = f"; use {INSTEAD[name]}" if name in INSTEAD else ""
            return f"--{name} is an upstream RTP-LLM flag ({group}) not implemented here: {why}{instead}"
    return None
