#include "rtp_llm/cpp/engine/generate_stream.h"

#include <algorithm>
#include <utility>

namespace rtp_llm {

const char* to_string(StreamStatus status) {
  switch (status) {
    case StreamStatus::WAITING: return "WAITING";
    case StreamStatus::RUNNING: return "RUNNING";
    case StreamStatus::FINISHED: return "FINISHED";
    case StreamStatus::ERROR: return "ERROR";
    case StreamStatus::CANCELLED: return "CANCELLED";
  }
  return "UNKNOWN";
}

GenerateStream::GenerateStream(int64_t id, std::vector<int32_t> prompt, GenerateConfig config, int max_seq_len,
                               int64_t now_us)
    : id_(id),
      tokens_(std::move(prompt)),
      prompt_len_(static_cast<int>(tokens_.size())),
      config_(std::move(config)),
      max_seq_len_(max_seq_len),
      thinking_(config_.in_think_mode && !config_.end_think_token_ids.empty()) {
  timing_.enqueue_us = now_us;
  grammar_pending = !config_.grammar.empty();
  tokens_.reserve(std::min(max_seq_len_, prompt_len_ + config_.max_new_tokens));
}

void GenerateStream::mark_scheduled(int64_t now_us) {
  if (timing_.first_scheduled_us == 0) timing_.first_scheduled_us = now_us;
  ++timing_.iter_count;
}

int32_t GenerateStream::forced_token() const {
  if (!thinking_ || config_.max_thinking_tokens <= 0 || num_generated() < config_.max_thinking_tokens) return -1;
  return config_.end_think_token_ids[think_matched_];
}

bool GenerateStream::may_force_after_next() const {
  return thinking_ && config_.max_thinking_tokens > 0 && num_generated() + 1 >= config_.max_thinking_tokens;
}

void GenerateStream::track_thinking(int32_t token) {
  if (!thinking_) return;
  const std::vector<int32_t>& end = config_.end_think_token_ids;
  // A prefix match is enough for end tags of distinct tokens (as "</think>", "\n\n").
  think_matched_ = token == end[think_matched_] ? think_matched_ + 1 : (token == end[0] ? 1 : 0);
  if (think_matched_ == static_cast<int>(end.size())) thinking_ = false;
}

void GenerateStream::record_prompt_logprob(int q, float logprob, const int32_t* top_ids, const float* top_logprobs,
                                           int num_top) {
  if (!wants_prompt_logprobs() || q != prompt_lp_next_ || q >= prompt_len_) return;
  ++prompt_lp_next_;
  prompt_logprobs_.push_back(logprob);
  const int k = config_.prompt_logprobs;  // the sampler returns at least k when asked; zeros otherwise
  const bool have = num_top >= k && top_ids != nullptr && top_logprobs != nullptr;
  for (int j = 0; j < k; ++j) {
    prompt_top_ids_.push_back(have ? top_ids[j] : 0);
    prompt_top_logprobs_.push_back(have ? top_logprobs[j] : 0.0f);
  }
}

bool GenerateStream::append(const SampledToken& sampled, const std::vector<int32_t>& eos_ids, int64_t now_us) {
  const int32_t token = sampled.token;
  tokens_.push_back(token);
  if (config_.return_logprobs) logprobs_.push_back(sampled.logprob);
  const int k = config_.top_logprobs;
  if (k > 0) {  // the sampler returns at least k when asked; zeros (never sent as such) otherwise
    const bool have = sampled.num_top >= k && sampled.top_ids != nullptr && sampled.top_logprobs != nullptr;
    for (int j = 0; j < k; ++j) {
      top_ids_.push_back(have ? sampled.top_ids[j] : 0);
      top_logprobs_.push_back(have ? sampled.top_logprobs[j] : 0.0f);
    }
  }
  track_thinking(token);
  if (timing_.first_token_us == 0) timing_.first_token_us = now_us;

  const int generated = num_generated();
  if (generated >= config_.max_new_tokens || num_tokens() >= max_seq_len_) {
    finish_reason_ = "length";
  } else if (generated >= config_.min_new_tokens &&
             ((!config_.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end()) ||
              hit_stop_words())) {
    finish_reason_ = "stop";
  } else if (config_.can_use_pd_separation) {
    handed_off_ = true;  // a decode instance continues it: finish_reason stays ""
  } else {
    return false;
  }
  finish(StreamStatus::FINISHED, {}, now_us);
  return true;
}

bool GenerateStream::resume(const std::vector<int32_t>& generated, const std::vector<int32_t>& eos_ids,
                            int64_t now_us) {
  for (const int32_t token : generated) {
    if (append(SampledToken{token, 0.0f}, eos_ids, now_us)) return false;
  }
  num_resumed_ = static_cast<int>(generated.size());
  return true;
}

bool GenerateStream::hit_stop_words() const {
  const int generated = num_generated();
  for (const auto& words : config_.stop_words_list) {
    const int n = static_cast<int>(words.size());
    if (n <= generated && std::equal(words.begin(), words.end(), tokens_.end() - n)) return true;
  }
  return false;
}

void GenerateStream::finish(StreamStatus status, ErrorInfo error, int64_t now_us) {
  status_ = status;
  error_ = std::move(error);
  timing_.finish_us = now_us;
}

}  // namespace rtp_llm
