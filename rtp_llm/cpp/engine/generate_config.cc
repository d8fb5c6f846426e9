#include "rtp_llm/cpp/engine/generate_config.h"

#include <string>

namespace rtp_llm {

ErrorInfo GenerateConfig::validate() const {
  if (max_new_tokens < 1) return invalid("max_new_tokens", "max_new_tokens must be >= 1, got " + std::to_string(max_new_tokens));
  if (min_new_tokens < 0) return invalid("min_new_tokens", "min_new_tokens must be >= 0, got " + std::to_string(min_new_tokens));
  if (timeout_ms < 0) return invalid("timeout_ms", "timeout_ms must be >= 0, got " + std::to_string(timeout_ms));
  if (!(temperature >= 0.0f)) return invalid("temperature", "temperature must be >= 0, got " + std::to_string(temperature));
  if (top_k < 0) return invalid("top_k", "top_k must be >= 0, got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) return invalid("top_p", "top_p must be in (0, 1], got " + std::to_string(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return invalid("min_p", "min_p must be in [0, 1], got " + std::to_string(min_p));
  if (!(repetition_penalty > 0.0f)) {
    return invalid("repetition_penalty", "repetition_penalty must be > 0, got " + std::to_string(repetition_penalty));
  }
  for (const auto& words : stop_words_list) {
    if (words.empty()) return invalid("stop_words_list", "stop_words_list must not contain an empty sequence");
  }
  return {};
}

}  // namespace rtp_llm
