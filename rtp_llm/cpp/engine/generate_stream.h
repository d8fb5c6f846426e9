// One request in the engine: its tokens, KV blocks, progress and outcome. Not thread-safe:
// the EngineCore's mutex guards every stream.
//
// Progress invariant (the only scheduling state): num_computed <= num_tokens(). A step runs
// tokens [num_computed, num_computed + n); when that reaches num_tokens() the step samples
// one token, which commit() appends. Prefix-cache hits advance num_computed at admission;
// preemption resets it to 0 and frees the blocks (recomputed later, mostly from the cache).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rtp_llm/cpp/cache/kv_cache_manager.h"
#include "rtp_llm/cpp/engine/drafter.h"
#include "rtp_llm/cpp/engine/error_code.h"
#include "rtp_llm/cpp/engine/generate_config.h"
#include "rtp_llm/cpp/engine/kv_handoff.h"

namespace rtp_llm {

enum class StreamStatus { WAITING, RUNNING, FINISHED, ERROR, CANCELLED };

const char* to_string(StreamStatus status);

// Timing and reuse figures reported in AuxInfoPB; microseconds since the epoch or counts.
struct StreamTiming {
  int64_t enqueue_us = 0;
  int64_t first_scheduled_us = 0;
  int64_t first_token_us = 0;
  int64_t finish_us = 0;
  int iter_count = 0;
  int reuse_len = 0;  // prompt tokens served by the prefix cache at first admission
};

// Speculative decoding, per stream (AuxInfoPB's speculative_* fields): steps in which it verified
// drafts, and per draft position p how many of those accepted the draft at p.
struct StreamSpecStats {
  int draft_rounds = 0;
  std::vector<int32_t> accepted_per_pos;
  // Counts a verified run of `drafted` tokens whose first `accepted` were accepted.
  void record(int drafted, int accepted) {
    ++draft_rounds;
    if (static_cast<int>(accepted_per_pos.size()) < drafted) accepted_per_pos.resize(drafted, 0);
    for (int p = 0; p < accepted; ++p) ++accepted_per_pos[p];
  }
};

// A sampled token and what the sampler says of it: its log-prob and the best `num_top`
// alternatives (ids and log-probs, best first; the stream keeps its config's top_logprobs of
// them, num_top >= that when asked).
struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;
  const int32_t* top_ids = nullptr;
  const float* top_logprobs = nullptr;
  int num_top = 0;
};

class GenerateStream {
 public:
  GenerateStream(int64_t id, std::vector<int32_t> prompt, GenerateConfig config, int max_seq_len, int64_t now_us);

  int64_t id() const { return id_; }
  const GenerateConfig& config() const { return config_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int num_tokens() const { return static_cast<int>(tokens_.size()); }
  int prompt_len() const { return prompt_len_; }
  int num_generated() const { return num_tokens() - prompt_len_; }
  // Generated tokens it arrived with (resume(): a PREFILL instance's first token), never sent again.
  int num_resumed() const { return num_resumed_; }
  const std::vector<float>& logprobs() const { return logprobs_; }
  // config().top_logprobs alternatives per generated token, row-major [num_generated, top_logprobs].
  const std::vector<int32_t>& top_ids() const { return top_ids_; }
  const std::vector<float>& top_logprobs() const { return top_logprobs_; }
  int max_seq_len() const { return max_seq_len_; }

  // Prompt log-probs (config().prompt_logprobs >= 0): token q's (1 <= q < prompt_len) at q - 1,
  // [prompt_len - 1]; its config().prompt_logprobs alternatives [prompt_len - 1, k] row-major.
  // Recorded at commit of the step that ran position q - 1, each once, in position order.
  bool wants_prompt_logprobs() const { return config_.prompt_logprobs >= 0; }
  // The first prompt position whose token's log-prob is not recorded yet (prompt_len: all are).
  int prompt_logprobs_next() const { return prompt_lp_next_; }
  // Some prompt log-prob is still to compute: the stream's prompt must run whole (no prefix cache).
  bool needs_prompt_rows() const { return wants_prompt_logprobs() && prompt_lp_next_ < prompt_len_; }
  // Token q's log-prob and `num_top` alternatives (ids, log-probs, best first); ignored unless
  // q == prompt_logprobs_next() (a recomputed row after preemption is never scheduled, see
  // Scheduler; this keeps the record exact regardless).
  void record_prompt_logprob(int q, float logprob, const int32_t* top_ids, const float* top_logprobs, int num_top);
  const std::vector<float>& prompt_logprobs() const { return prompt_logprobs_; }
  const std::vector<int32_t>& prompt_top_ids() const { return prompt_top_ids_; }
  const std::vector<float>& prompt_top_logprobs() const { return prompt_top_logprobs_; }

  StreamStatus status() const { return status_; }
  bool done() const { return status_ >= StreamStatus::FINISHED; }
  const ErrorInfo& error() const { return error_; }
  // "" unless FINISHED: "stop" (EOS, stop words) or "length" (max_new_tokens, max_seq_len or
  // the KV-cache capacity); "" too when handed off (exports_kv). The one source of AuxInfoPB.finish_reason.
  const std::string& finish_reason() const { return finish_reason_; }
  const StreamTiming& timing() const { return timing_; }
  const StreamSpecStats& spec() const { return spec_; }
  StreamSpecStats& spec() { return spec_; }

  // Scheduling state, owned by the Scheduler. Steps in flight (scheduled, not yet committed;
  // at most two: the one the model runs and the one scheduled ahead of its result) hold
  // `pending_computed` query tokens and `pending_sampled` sampled tokens (0..2) that
  // num_computed and tokens() do not count yet.
  int num_computed = 0;
  BlockTable block_table;
  int in_flight = 0;              // steps in flight that hold this stream (blocks are freed at 0)
  int pending_computed = 0;
  int pending_sampled = 0;
  int pending_row = -1;           // row of the latest such step's sampled tokens (when it samples)
  // Tokens drafted after the last known one in the step in flight that holds it (speculative
  // decoding; 0: none). Such a step is the only one in flight holding the stream: it drafts only
  // when nothing of it is in flight, and it does not run ahead while its drafts are verified.
  int pending_drafts = 0;
  DraftPace draft_pace;           // how many it drafts next (drafter.h)
  bool cancel_requested = false;  // abort() arrived while in flight: finish at commit
  // Set when it finished with exports_kv(): its table's full prompt blocks, in order (the export).
  std::vector<int32_t> kv_export_blocks;
  // A stream with a grammar is not admitted until the engine process has compiled it
  // (EngineCore::grammar_done): its first sample needs the grammar's token mask.
  bool grammar_pending = false;
  // A DECODE instance's stream is not admitted until its prompt's KV blocks were read
  // (EngineCore::kv_import_done); kv_handover says from where (blocks, source).
  bool kv_import_pending = false;
  KvHandover kv_handover;
  // Admission passes over it: it waits for the engine process (a grammar, a KV read).
  bool held() const { return grammar_pending || kv_import_pending; }

  // Tokens once every step in flight has committed: the next step starts at the first, and
  // the last of them is sampled by a step in flight when pending_sampled > 0.
  int scheduled_computed() const { return num_computed + pending_computed; }
  int scheduled_tokens() const { return num_tokens() + pending_sampled; }

  void mark_scheduled(int64_t now_us);
  // Appends a sampled token and applies the stop criteria. Returns true when finished.
  bool append(const SampledToken& sampled, const std::vector<int32_t>& eos_ids, int64_t now_us);
  bool append(int32_t token, float logprob, const std::vector<int32_t>& eos_ids, int64_t now_us) {
    return append(SampledToken{token, logprob}, eos_ids, now_us);
  }
  // Before it is scheduled: continues after `generated`, tokens sampled elsewhere for this request
  // (prefill/decode disaggregation), as if it had appended them (log-prob 0). Returns false when
  // they finish it (nothing is left to generate): the caller refuses the request and drops it.
  bool resume(const std::vector<int32_t>& generated, const std::vector<int32_t>& eos_ids, int64_t now_us);
  // A can_use_pd_separation stream ends after its first token, handed off to a decode instance
  // (finish_reason "") unless that token ended the request (a stop or length: finish_reason says
  // which). Its blocks go to the decode instance once no step holds them.
  bool exports_kv() const { return handed_off_ && status_ == StreamStatus::FINISHED; }
  // Thinking budget (GenerateConfig::max_thinking_tokens): -1, or the token the next sample
  // must be (the next of end_think_token_ids: the budget is spent and thinking not closed).
  int32_t forced_token() const;
  // Whether the sample after the one in flight may be forced: that needs the state after
  // the token in flight, so such a stream does not run ahead.
  bool may_force_after_next() const;
  void finish(StreamStatus status, ErrorInfo error, int64_t now_us);
  void set_status(StreamStatus status) { status_ = status; }
  void set_reuse_len(int n) { timing_.reuse_len = n; }
  bool timed_out(int64_t now_us) const {
    return config_.timeout_ms > 0 && now_us - timing_.enqueue_us > int64_t{config_.timeout_ms} * 1000;
  }

 private:
  bool hit_stop_words() const;
  void track_thinking(int32_t token);

  int64_t id_;
  std::vector<int32_t> tokens_;
  std::vector<float> logprobs_;
  std::vector<int32_t> top_ids_;
  std::vector<float> top_logprobs_;
  int prompt_len_;
  int num_resumed_ = 0;
  bool handed_off_ = false;
  int prompt_lp_next_ = 1;  // token 0 has no log-prob (nothing precedes it)
  std::vector<float> prompt_logprobs_;
  std::vector<int32_t> prompt_top_ids_;
  std::vector<float> prompt_top_logprobs_;
  GenerateConfig config_;
  int max_seq_len_;  // total tokens this stream may reach (model limit and KV capacity)
  StreamStatus status_ = StreamStatus::WAITING;
  ErrorInfo error_;
  std::string finish_reason_;
  StreamTiming timing_;
  StreamSpecStats spec_;
  bool thinking_;        // inside the thinking (from in_think_mode until end_think_token_ids)
  int think_matched_ = 0;  // leading tokens of end_think_token_ids that end the tokens so far
};

}  // namespace rtp_llm
