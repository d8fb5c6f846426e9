// Per-request generation settings the core needs: stop criteria and the sampling parameters
// it hands to the model runner in each step batch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "rtp_llm/cpp/engine/error_code.h"
#include "rtp_llm/cpp/engine/step_batch_fields.h"

namespace rtp_llm {

// The grammar fields of GenerateConfigPB (upstream's names; StringValue), in the order a
// request is checked: a stream follows at most one. X(name).
#define RTP_LLM_GRAMMAR_FIELDS(X) X(json_schema) X(regex) X(ebnf) X(structural_tag)

// A stream's grammar: the field it came in (one of RTP_LLM_GRAMMAR_FIELDS, "" when none) and
// its text. The engine process compiles it (rtp_llm/async_decoder_engine/grammar.py); the core
// only holds the stream back until then.
struct GrammarSpec {
  std::string field;
  std::string spec;
  std::string conflict;  // a second grammar field the request set (refused by validate())
  bool empty() const { return field.empty(); }
};

struct GenerateConfig {
  int max_new_tokens = 256;
  int min_new_tokens = 0;
  bool ignore_eos = false;
  std::vector<std::vector<int32_t>> stop_words_list;  // token sequences ending generation
  int timeout_ms = 0;                                 // 0: none
  GrammarSpec grammar;
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the logits before sampling;
  // at most RTP_LLM_MAX_LOGIT_BIAS entries, ids not checked against the vocabulary (the
  // sampler ignores ids past it; the frontend refuses them).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Upstream's thinking budget: with in_think_mode, generation starts inside the thinking,
  // which ends when end_think_token_ids appear; once max_thinking_tokens (> 0) tokens were
  // generated inside it, the rest of end_think_token_ids is forced, one token a step.
  bool in_think_mode = false;
  int max_thinking_tokens = 0;  // 0: no budget
  std::vector<int32_t> end_think_token_ids;
  // Upstream's per-request opt-out of speculative decoding: the stream never drafts.
  bool force_disable_sp_run = false;
  // Upstream's can_use_pd_separation (a PREFILL instance's request): the stream ends after its
  // first token and its blocks are kept for a decode instance (GenerateStream::exports_kv).
  bool can_use_pd_separation = false;

  // Sampling (applied by the model runner; the core only carries them): names, defaults and
  // ranges in RTP_LLM_ALL_SAMPLING (step_batch_fields.h). temperature 0: greedy; top_k 0:
  // all; random_seed -1: none.
#define RTP_LLM_SAMPLING_MEMBER(type, name, def, ...) RTP_LLM_CTYPE(type) name = def;
  RTP_LLM_ALL_SAMPLING(RTP_LLM_SAMPLING_MEMBER)
#undef RTP_LLM_SAMPLING_MEMBER

  // Empty message when valid; otherwise names the field at fault.
  ErrorInfo validate() const;

 private:
  ErrorInfo validate_logits_rules() const;  // logit_bias and the thinking budget
};

}  // namespace rtp_llm
