// Per-request generation settings the core needs: stop criteria and the sampling parameters
// it hands to the model runner in each step batch.
#pragma once

#include <cstdint>
#include <string>
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

  // Sampling (applied by the model runner; the core only carries them): names, defaults and
  // ranges in RTP_LLM_ALL_SAMPLING (step_batch_fields.h). temperature 0: greedy; top_k 0:
  // all; random_seed -1: none.
#define RTP_LLM_SAMPLING_MEMBER(type, name, def, ...) RTP_LLM_CTYPE(type) name = def;
  RTP_LLM_ALL_SAMPLING(RTP_LLM_SAMPLING_MEMBER)
#undef RTP_LLM_SAMPLING_MEMBER

  // Empty message when valid; otherwise names the field at fault.
  ErrorInfo validate() const;
};

}  // namespace rtp_llm
