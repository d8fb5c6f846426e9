#include "rtp_llm/cpp/engine/drafter.h"

#include <algorithm>

namespace rtp_llm {

int NgramDrafter::propose(const int32_t* tokens, int n, int max_tokens, int32_t* out) const {
  if (max_tokens <= 0) return 0;
  for (int m = std::min(max_match_, n - 1); m >= min_match_; --m) {
    const int32_t* suffix = tokens + n - m;
    // Latest earlier occurrence: starts p < n - m, so at least one token follows it.
    for (int p = n - m - 1; p >= 0; --p) {
      if (!std::equal(suffix, suffix + m, tokens + p)) continue;
      const int from = p + m;
      const int count = std::min(max_tokens, n - from);
      std::copy(tokens + from, tokens + from + count, out);
      return count;
    }
  }
  return 0;
}

int DraftPace::allowance(int max_drafts) {
  if (skip_ > 0) {
    --skip_;
    return 0;
  }
  return limit(max_drafts);
}

void DraftPace::record(int drafted, int accepted, int max_drafts) {
  const int current = limit(max_drafts);
  if (accepted > 0) backoff_ = 0;
  if (accepted == drafted) {
    limit_ = std::min(max_drafts, 2 * current);
  } else if (accepted > 0 || current > 1) {
    limit_ = accepted + 1;
  } else {  // nothing accepted of a single draft: pause, longer each time
    limit_ = 1;
    backoff_ = backoff_ == 0 ? 1 : std::min(2 * backoff_, kMaxBackoff);
    skip_ = backoff_;
  }
}

}  // namespace rtp_llm
