#include "rtp_llm/cpp/engine/generate_config.h"

#include <cmath>
#include <cstdio>
#include <string>

namespace rtp_llm {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// `value` within [lo, hi] ((lo, hi] when lo_open); infinite bounds are none. Written so that
// NaN fails every finite bound.
ErrorInfo check_range(const char* name, double value, double lo, bool lo_open, double hi) {
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  const bool ok = (!has_lo || (lo_open ? value > lo : value >= lo)) && (!has_hi || value <= hi);
  if (ok) return {};
  std::string want;
  if (has_lo && has_hi) {
    want = "in " + std::string(lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + "]";
  } else if (has_lo) {
    want = (lo_open ? "> " : ">= ") + num(lo);
  } else {
    want = "<= " + num(hi);
  }
  return invalid(name, std::string(name) + " must be " + want + ", got " + num(value));
}

}  // namespace

ErrorInfo GenerateConfig::validate() const {
  if (max_new_tokens < 1) return invalid("max_new_tokens", "max_new_tokens must be >= 1, got " + num(max_new_tokens));
  if (min_new_tokens < 0) return invalid("min_new_tokens", "min_new_tokens must be >= 0, got " + num(min_new_tokens));
  if (timeout_ms < 0) return invalid("timeout_ms", "timeout_ms must be >= 0, got " + num(timeout_ms));
#define RTP_LLM_CHECK_RANGE(type, name, def, lo, lo_open, hi)                            \
  if (ErrorInfo e = check_range(#name, static_cast<double>(name), lo, lo_open, hi); !e.ok()) { \
    return e;                                                                             \
  }
  RTP_LLM_ALL_SAMPLING(RTP_LLM_CHECK_RANGE)
#undef RTP_LLM_CHECK_RANGE
  if (!grammar.conflict.empty()) {
    return invalid(grammar.conflict, "only one of json_schema, regex, ebnf and structural_tag may be set (" +
                                         grammar.field + " is set too)");
  }
  if (!grammar.empty() && grammar.spec.empty()) return invalid(grammar.field, grammar.field + " must not be empty");
  for (const auto& words : stop_words_list) {
    if (words.empty()) return invalid("stop_words_list", "stop_words_list must not contain an empty sequence");
  }
  return {};
}

}  // namespace rtp_llm
