// Error codes of a request, numbered as upstream RTP-LLM's ErrorCode (rtp_llm/cpp/utils),
// so clients that switch on them keep working.
#pragma once

#include <string>

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
  ErrorCode code = ErrorCode::NONE_ERROR;
  std::string message;
  bool ok() const { return code == ErrorCode::NONE_ERROR; }
};

}  // namespace rtp_llm
