/* The one declaration of what crosses the engine core's C ABI: the per-stream sampling
   parameters, the step batch's counts and arrays, and the engine's config and stats. C++
   (GenerateConfig, StepBatch, EngineCoreConfig, the scheduler, the proto conversion), the C
   structs of engine_api.h, their self-description (rtp_llm_struct_info) and through it
   Python's ctypes mirror and numpy views are all expanded from these lists. C-compatible:
   engine_api.h includes it.

   Element types: i32 (int32_t), i64 (int64_t), f32 (float).
   Array lengths: S = num_streams, S1 = S + 1, T = num_tokens, SB = S * block_table_stride
   (row-major [S, B]), H = num_history_tokens, L = num_bias_entries.
   Groups of the step arrays: MODEL (every rank's model path reads it: broadcast under tensor
   parallelism), SAMPLE (rank 0's sampler reads it, masked to the sampled rows), HOST (the
   core's bookkeeping). Every sampling parameter is an [S] array of the SAMPLE group. */
#ifndef RTP_LLM_STEP_BATCH_FIELDS_H_
#define RTP_LLM_STEP_BATCH_FIELDS_H_

#include <math.h>
#include <stdint.h>

#define RTP_LLM_CTYPE(t) RTP_LLM_CTYPE_##t
#define RTP_LLM_CTYPE_i32 int32_t
#define RTP_LLM_CTYPE_i64 int64_t
#define RTP_LLM_CTYPE_f32 float

/* Alternatives (top log-probs) a sampled token may carry; logit_bias entries per request. */
#define RTP_LLM_MAX_TOP_LOGPROBS 20
#define RTP_LLM_MAX_LOGIT_BIAS 1024

/* Per-stream sampling parameters whose GenerateConfigPB field has the same name and type:
   X(type, name, default, lo, lo_open, hi). Valid values lie in [lo, hi] ((lo, hi] when
   lo_open); HUGE_VAL bounds are none. A proto value of 0 outside the range means unset: the
   default (proto3 cannot tell unset from 0). */
#define RTP_LLM_SAMPLING_PARAMS(X)                     \
  X(f32, temperature, 1.0f, 0.0, 0, HUGE_VAL)          \
  X(i32, top_k, 0, 0.0, 0, HUGE_VAL)                   \
  X(f32, top_p, 1.0f, 0.0, 1, 1.0)                     \
  X(f32, min_p, 0.0f, 0.0, 0, 1.0)                     \
  X(f32, repetition_penalty, 1.0f, 0.0, 1, HUGE_VAL)   \
  X(f32, presence_penalty, 0.0f, -HUGE_VAL, 0, HUGE_VAL) \
  X(f32, frequency_penalty, 0.0f, -HUGE_VAL, 0, HUGE_VAL) \
  X(i32, top_logprobs, 0, 0.0, 0, RTP_LLM_MAX_TOP_LOGPROBS)

/* Sampling parameters converted by hand in proto_convert.cc: random_seed is an Int64Value
   (-1: none), return_logprobs is return_softmax_probs || return_cum_log_probs,
   no_repeat_ngram_size an Int32Value (0: off; it reads the history, as the penalties do),
   prompt_logprobs an Int32Value (vLLM's: -1 off; k >= 0: each prompt token's log-prob under the
   raw model distribution and its k best alternatives; the prompt_targets rows compute them). */
#define RTP_LLM_SAMPLING_SPECIAL(X)                     \
  X(i64, random_seed, -1, -HUGE_VAL, 0, HUGE_VAL)       \
  X(i32, return_logprobs, 0, 0.0, 0, 1.0)               \
  X(i32, no_repeat_ngram_size, 0, 0.0, 0, HUGE_VAL)     \
  X(i32, prompt_logprobs, -1, -1.0, 0, RTP_LLM_MAX_TOP_LOGPROBS)

#define RTP_LLM_ALL_SAMPLING(X) RTP_LLM_SAMPLING_PARAMS(X) RTP_LLM_SAMPLING_SPECIAL(X)

/* The step batch's counts (int32): X(name). */
#define RTP_LLM_STEP_COUNTS(X)                                                          \
  X(num_streams)        /* S */                                                         \
  X(num_tokens)         /* T = sum(query_lens) */                                       \
  X(num_sampled)        /* streams with do_sample = 1; commit() takes that many tokens */ \
  X(block_table_stride) /* B = max blocks of any stream in this step */                 \
  X(num_prefill)        /* streams that run prompt tokens (not a single decode token) */ \
  X(num_history_tokens) /* H: tokens in history_tokens */                               \
  X(num_bias_entries)   /* L: entries in bias_tokens / bias_values */                   \
  X(num_grammar)        /* sampled streams with a grammar: the sampler masks their logits */ \
  X(num_prompt_logprobs) /* P: tokens with prompt_targets[t] >= 0; commit() takes that many rows */ \
  X(num_draft_tokens)   /* D = sum(draft_lens); commit() takes num_sampled + D tokens */

/* The step batch's arrays other than the sampling parameters: X(type, name, length, group). */
#define RTP_LLM_STEP_ARRAYS(X)                                                                  \
  X(i64, stream_ids, S, HOST)                                                                   \
  X(i32, query_lens, S, MODEL)      /* tokens run this step */                                  \
  X(i32, prefix_lens, S, MODEL)     /* positions already in the KV cache before this step */   \
  X(i32, context_lens, S, MODEL)    /* prefix_lens + query_lens (KV length after the step) */  \
  X(i32, query_starts, S1, MODEL)   /* exclusive prefix sum of query_lens */                    \
  X(i32, do_sample, S, MODEL)       /* 1 when this step ends the stream's known tokens */       \
  /* Speculative decoding: the stream's last query_lens tokens are its last known token and     \
     draft_lens[i] drafted ones (do_sample is 1); each of those 1 + d positions is sampled, in   \
     order, so a step's sampled rows are, per do_sample stream, its last 1 + draft_lens rows. */ \
  X(i32, draft_lens, S, MODEL)                                                                  \
  X(i32, block_tables, SB, MODEL)   /* block ids, rows padded with 0 */                         \
  X(i32, token_ids, T, MODEL)       /* -1 - r: row r of the step in flight's samples */         \
  X(i32, positions, T, MODEL)                                                                   \
  X(i64, slot_mapping, T, MODEL)    /* block_id * block_size + offset of each token's KV */     \
  /* The prompt token after token t when its stream asks prompt_logprobs, that next token is a  \
     prompt token and its log-prob is not recorded yet (preemption recomputes without repeats); \
     else -1. The model computes logits for these rows too (after the sampled rows). */         \
  X(i32, prompt_targets, T, MODEL)                                                              \
  X(i32, num_generated, S, SAMPLE)  /* tokens generated so far: a seeded sample's position */   \
  X(i32, grammar, S, SAMPLE)        /* 1: the stream's samples follow its grammar (compiled) */  \
  /* Penalized (or no_repeat_ngram_size) sampled rows' token history (prompt, then generated; complete: nothing is      \
     scheduled ahead of such a row), history_tokens[history_starts[i] +: history_lens[i]];    \
     other rows have history_lens 0. */                                                       \
  X(i32, history_starts, S, SAMPLE)                                                             \
  X(i32, history_lens, S, SAMPLE)                                                               \
  X(i32, history_tokens, H, SAMPLE)                                                             \
  /* Sampled rows' logit_bias: bias_values[j] is added to the logit of bias_tokens[j], j in     \
     [bias_starts[i], bias_starts[i] + bias_lens[i]); other rows have bias_lens 0. */           \
  X(i32, bias_starts, S, SAMPLE)                                                                \
  X(i32, bias_lens, S, SAMPLE)                                                                  \
  X(i32, bias_tokens, L, SAMPLE)                                                                \
  X(f32, bias_values, L, SAMPLE)                                                                \
  /* -1, or the one token the row may sample (max_thinking_tokens spent: the end of thinking) */ \
  X(i32, forced_tokens, S, SAMPLE)

/* RtpEngineConfig's scalar fields: X(type, name, default, min). */
#define RTP_LLM_ENGINE_CONFIG(X)                   \
  X(i32, num_blocks, 1024, 1)     /* KV-cache blocks */ \
  X(i32, block_size, 16, 1)       /* tokens per block */ \
  X(i32, max_batch_size, 256, 1)  /* streams per step */ \
  X(i32, max_num_batched_tokens, 4096, 1) /* token budget per step (longer prompts are chunked) */ \
  X(i32, max_seq_len, 4096, 2)    /* prompt + generated tokens per stream */ \
  X(i32, reuse_cache, 1, 0)       /* 1: prefix cache on */ \
  X(i32, vocab_size, 0, 0)        /* prompt token ids must be below it (0: unchecked) */ \
  /* Speculative decoding (upstream's flags): the most drafted tokens per stream per step (0: off), \
     and the prompt-lookup drafter's n-gram sizes, longest tried first. */ \
  X(i32, gen_num_per_cycle, 0, 0) \
  X(i32, sp_min_token_match, 2, 1) \
  X(i32, sp_max_token_match, 3, 1) \
  /* 1: a draft model proposes the drafts (the model runner fills the positions the core \
     reserves: DeferredDrafter); 0: prompt lookup. */ \
  X(i32, draft_model, 0, 0) \
  /* 1: every round drafts up to gen_num_per_cycle tokens (--sp_draft_pace=fixed); 0: DraftPace \
     sets each stream's allowance from its last rounds (drafter.h). */ \
  X(i32, sp_fixed_drafts, 0, 0) \
  /* Prefill/decode disaggregation: how long a PREFILL instance keeps a request's KV blocks for \
     a decode instance that has not read them (RemoteFinish) before freeing them (0: 30 s, so a \
     zero-initialized config stays valid). */ \
  X(i32, kv_export_timeout_ms, 30000, 0)

/* RtpEngineStats: X(type, name, source in rtp_llm::EngineStats). */
#define RTP_LLM_ENGINE_STATS(X)                 \
  X(i32, running, running)                     \
  X(i32, waiting, waiting)                     \
  X(i32, tracked_streams, tracked_streams)     \
  X(i32, total_blocks, kv.total_blocks)        \
  X(i32, free_blocks, kv.free_blocks)          \
  X(i32, cached_blocks, kv.cached_blocks)      \
  X(i32, used_blocks, kv.used_blocks)          \
  X(i32, block_size, kv.block_size)            \
  X(i64, hit_tokens, kv.hit_tokens)            \
  X(i64, lookup_tokens, kv.lookup_tokens)      \
  X(i64, steps, steps)                         \
  X(i64, preemptions, preemptions)             \
  X(i64, finished, finished)                   \
  X(i64, generated_tokens, generated_tokens)   \
  X(i64, grammar_requests, grammar.requests)   /* streams with a grammar */ \
  X(i64, grammar_cache_hits, grammar.cache_hits) /* of those, compiled already (or compiling) */ \
  X(i64, grammar_compiles, grammar.compiles)   /* grammars compiled */ \
  X(i64, grammar_compile_us, grammar.compile_us) /* their compile time, summed */ \
  X(i64, grammar_failures, grammar.failures)   /* grammars that failed to compile or timed out */ \
  X(i64, spec_draft_rounds, spec.draft_rounds) /* stream-steps that verified drafts */ \
  X(i64, spec_draft_tokens, spec.draft_tokens) /* tokens drafted (and verified) */ \
  X(i64, spec_accepted_tokens, spec.accepted_tokens) /* of those, accepted */ \
  X(i32, kv_exports, kv_exports)               /* PREFILL: requests' KV blocks kept for a decode instance */ \
  X(i64, kv_exports_expired, kv_exports_expired) /* of all kept, freed unread at their timeout */ \
  X(i64, kv_exported_blocks, kv_transfer.exported_blocks) /* PREFILL: blocks kept for decode instances */ \
  X(i64, kv_imported_blocks, kv_transfer.imported_blocks) /* DECODE: blocks read from PREFILL instances */ \
  X(i64, kv_import_bytes, kv_transfer.import_bytes)   /* their bytes */ \
  X(i64, kv_import_us, kv_transfer.import_us)         /* the reads' time, summed */ \
  X(i64, kv_imports, kv_transfer.imports)             /* reads (one per request) */ \
  X(i64, kv_import_failures, kv_transfer.failures)    /* reads that failed (their prompts recomputed) */

#endif /* RTP_LLM_STEP_BATCH_FIELDS_H_ */
