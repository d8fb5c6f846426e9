// Error codes of a request, numbered as upstream RTP-LLM's ErrorCode (rtp_llm/cpp/utils),
// so clients that switch on them keep working.
#pragma once

#include <string>
#include <utility>

namespace rtp_llm {

enum class ErrorCode : int {
  NONE_ERROR = 0,
  LONG_PROMPT_ERROR = 511,
  CONCURRENCY_LIMIT_ERROR = 513,  // the waiting queue is full: try again later
  UNKNOWN_ERROR = 514,
  MALLOC_FAILED = 602,
  GENERATE_TIMEOUT = 603,
  INVALID_PARAMS = 605,
  EXECUTION_EXCEPTION = 606,
  EXCEEDS_KV_CACHE_MAX_LEN = 607,
  CANCELLED = 8100,
};

struct ErrorInfo {
  ErrorInfo() = default;
  ErrorInfo(ErrorCode c, std::string m, std::string f = "") : code(c), message(std::move(m)), field(std::move(f)) {}

  ErrorCode code = ErrorCode::NONE_ERROR;
  std::string message;
  // The request field the error is about, in the core's naming: "token_ids" for the prompt,
  // a generate_config key otherwise (or a config field of the engine); "" when none.
  std::string field;
  bool ok() const { return code == ErrorCode::NONE_ERROR; }
};

// INVALID_PARAMS about `field`.
inline ErrorInfo invalid(const std::string& field, const std::string& message) {
  return {ErrorCode::INVALID_PARAMS, message, field};
}

}  // namespace rtp_llm
