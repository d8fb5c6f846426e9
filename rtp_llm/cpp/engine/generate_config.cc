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

ErrorInfo GenerateConfig::validate_logits_rules() const {
  if (logit_bias.size() > RTP_LLM_MAX_LOGIT_BIAS) {
    return invalid("logit_bias", "logit_bias may have at most " + num(RTP_LLM_MAX_LOGIT_BIAS) + " entries, got " +
                                     num(static_cast<double>(logit_bias.size())));
  }
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0) return invalid("logit_bias", "logit_bias token ids must be >= 0, got " + num(token));
    if (ErrorInfo e = check_range("logit_bias", bias, -100.0, false, 100.0); !e.ok()) return e;
  }
  if (max_thinking_tokens < 0) {
    return invalid("max_thinking_tokens", "max_thinking_tokens must be >= 0, got " + num(max_thinking_tokens));
  }
  if (in_think_mode && max_thinking_tokens > 0 && end_think_token_ids.empty()) {
    return invalid("end_think_token_ids", "a thinking budget (max_thinking_tokens) needs end_think_token_ids");
  }
  return {};
}

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
  return validate_logits_rules();
}

}  // namespace rtp_llm
