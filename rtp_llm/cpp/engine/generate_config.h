// Per-request generation settings the core needs: stop criteria and the sampling parameters
// it hands to the model runner in each step batch.
#pragma once

#include <cstdint>
#include <vector>

#include "rtp_llm/cpp/engine/error_code.h"

namespace rtp_llm {

struct GenerateConfig {
  int max_new_tokens = 256;
  int min_new_tokens = 0;
  bool ignore_eos = false;
  std::vector<std::vector<int32_t>> stop_words_list;  // token sequences ending generation
  int timeout_ms = 0;                                 // 0: none
  bool is_streaming = false;

  // Sampling (applied by the model runner; the core only carries them).
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0: all
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int64_t random_seed = -1;  // -1: none
  bool return_logprobs = false;

  // Empty message when valid; otherwise names the field at fault.
  ErrorInfo validate() const;
};

}  // namespace rtp_llm
