// Per-request generation settings the core needs: stop criteria and the sampling parameters
// it hands to the model runner in each step batch.
#pragma once

#include <cstdint>
#include <vector>

#include "rtp_llm/cpp/engine/error_code.h"
#include "rtp_llm/cpp/engine/step_batch_fields.h"

namespace rtp_llm {

struct GenerateConfig {
  int max_new_tokens = 256;
  int min_new_tokens = 0;
  bool ignore_eos = false;
  std::vector<std::vector<int32_t>> stop_words_list;  // token sequences ending generation
  int timeout_ms = 0;                                 // 0: none

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
