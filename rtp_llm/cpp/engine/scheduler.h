// Continuous batching under one per-step token budget (vLLM v1's invariant): each stream's
// num_computed catches up with its token count. Running streams go first, oldest first,
// each taking what it still needs (1 for decode, a chunk of its prompt otherwise); waiting
// streams are admitted FIFO with what budget, batch slots and blocks are left. When a
// running stream cannot grow, the most recently admitted running stream is preempted
// (blocks freed, num_computed = 0, back to the head of the queue) until it can.
//
// Overlap: while one step is in flight, the next may be scheduled ahead of its result. A
// stream whose token that step samples then runs on a placeholder, token id -1 - row (row of
// the in-flight step's sampled tokens; the model runner resolves it on the device). Ahead
// scheduling never preempts (the running steps own those blocks) and leaves out streams
// whose next step depends on the host seeing the token first: a sure finish (max_new_tokens /
// max_seq_len), pending cancellations and timeouts, and a stream whose thinking budget may force
// the sample after the one in flight (that depends on the token in flight). While a stream with penalties samples
// (the sampler reads its history, which the step batch carries in history_tokens) nothing is
// scheduled ahead: the engine steps in turn, so the history is complete at schedule time. A
// stream that stops on its token (EOS, stop words) wastes one row: its ahead sample is
// dropped at commit.
//
// Prompt log-probs (GenerateConfig::prompt_logprobs): such a stream's prompt positions whose
// next token is a prompt token get it in prompt_targets until its log-prob is recorded (at
// commit), so chunked prefill yields each chunk's rows and a recompute after preemption none
// twice. While some are missing the stream is admitted without the prefix cache (every prompt
// position must run); its full blocks are still published for others. Such streams together run
// at most max_prompt_rows tokens a step (a second budget, beside the step's).
//
// Speculative decoding (max_drafts > 0 and a Drafter, engine_core.h): a running decode stream
// whose tokens are all known (nothing of it in flight), without a grammar, thinking budget or
// prompt log-probs and not force_disable_sp_run, gets up to max_drafts drafted tokens after its
// last one, fewer after rounds that were rejected (its DraftPace, drafter.h) (its penalty
// history holds its tokens; the sampler adds the drafts before each row, ops/draft_rows.py): each counts
// against the step's budget; accepting them all plus the token after stays within max_new_tokens
// and max_seq_len; and drafts never preempt (a stream short of blocks for them runs without).
// The step runs its 1 + d positions and samples each (greedily, or by rejection sampling, whose
// row for draft j yields that draft exactly when it is accepted: models_py/rejection_sampler.py).
// Commit appends the sampled tokens in order while the drafts equal them, plus the first that
// differs (1 .. d + 1 tokens), each through the stop criteria (tokens after a stop are
// dropped). Rejected drafts leave no trace:
// num_computed counts only positions whose tokens were kept (the rejected ones' KV slots are
// written again next step), blocks past the stream's tokens are freed, and publish_computed
// sees only computed, hence verified, tokens. A stream that may draft does not run ahead of its
// own token (its drafts come from its known tokens; and while its drafts are in flight, how
// many tokens it keeps is unknown until commit), so no other step in flight holds a stream with
// drafts; streams that may not draft run ahead as before. Overlapped, a lone drafting stream
// thus steps in turn; in a mixed batch it runs every other step, the others every step.
//
// Grammars: a waiting stream whose grammar is still compiling (grammar_pending) is passed
// over by admission (streams behind it are admitted meanwhile); once admitted, its sampled
// rows are marked (`grammar`, `num_grammar`) for the sampler's token mask. A stream whose KV
// blocks are being read from a PREFILL instance (kv_import_pending) is passed over the same way.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "rtp_llm/cpp/cache/kv_cache_manager.h"
#include "rtp_llm/cpp/engine/drafter.h"
#include "rtp_llm/cpp/engine/generate_stream.h"
#include "rtp_llm/cpp/engine/kv_handoff.h"
#include "rtp_llm/cpp/engine/step_batch.h"

namespace rtp_llm {

// What the sampler returns for one step's sampled rows, in batch order (per do_sample stream its
// last 1 + draft_lens rows: N = num_sampled + num_draft_tokens): tokens [N], their
// log-probs [N] (null: none asked for) and the best top_k alternatives of each row
// ([N, top_k] ids and log-probs, row-major; null when top_k is 0); and the prompt rows' (the
// step's tokens with prompt_targets >= 0, in token order): the target's log-prob [P] and the
// best prompt_top_k alternatives [P, prompt_top_k] under the raw model distribution.
struct StepSamples {
  const int32_t* tokens = nullptr;
  const float* logprobs = nullptr;
  const int32_t* top_ids = nullptr;
  const float* top_logprobs = nullptr;
  int top_k = 0;
  const float* prompt_logprobs = nullptr;
  const int32_t* prompt_top_ids = nullptr;
  const float* prompt_top_logprobs = nullptr;
  int prompt_top_k = 0;
  int num_prompt = 0;  // P: must equal the batch's num_prompt_logprobs
};

struct SchedulerConfig {
  int max_batch_size = 256;            // streams per step
  int max_num_batched_tokens = 4096;   // token budget per step (chunked prefill above it)
  // Tokens per step of the streams that still need prompt log-probs, all together: each is a
  // logits row ([vocab] fp32, 0.6 MB for a 152k vocabulary) the model runner materialises, so a
  // budget-sized chunk of them (8192 on CUDA: 5 GB) could run the device out of memory.
  int max_prompt_rows = 512;
  int max_drafts = 0;  // speculative decoding: drafted tokens per stream per step (0: off)
  bool fixed_drafts = false;  // true: every round may draft max_drafts; false: DraftPace's allowance
};

// Speculative decoding since start (EngineStats): stream-steps that verified drafts, tokens
// drafted in them, and of those accepted.
struct SpecStats {
  int64_t draft_rounds = 0, draft_tokens = 0, accepted_tokens = 0;
};

class Scheduler {
 public:
  // drafter: proposes the drafts when config.max_drafts > 0 (may be null: none); handoff: takes the
  // blocks of streams that export them (GenerateStream::exports_kv; may be null). Neither owned.
  Scheduler(SchedulerConfig config, KVCacheManager& kv, int max_seq_len, const Drafter* drafter = nullptr,
            KvHandoff* handoff = nullptr);

  void add(GenerateStream* stream) { waiting_.push_back(stream); }
  // Removes a stream that is not in flight (finished, cancelled or timed out), freeing its
  // blocks. Streams in flight are removed by commit() instead.
  void remove(GenerateStream* stream);

  // Ends streams past their timeout_ms (GENERATE_TIMEOUT), appending them to `ended`.
  void expire(int64_t now_us, std::vector<GenerateStream*>& ended);
  static constexpr int kMaxStepsInFlight = 2;
  // Fills `batch` for the next step and marks its streams in flight; ahead of the step in
  // flight if there is one (at most kMaxStepsInFlight - 1 steps may be in flight).
  void schedule(StepBatch& batch, int64_t now_us);
  // Applies the oldest step in flight: advances num_computed, publishes full blocks, appends the sampled
  // tokens (`tokens`/`logprobs` in batch order of the sampled rows; drafts verified as above), applies stop
  // criteria and pending cancellations. Streams that ended are removed and freed, and are
  // appended to `ended`; streams that got a token are appended to `updated`. appended (may be
  // null): per sampled row, 1 when its token was appended, 0 when dropped (its stream ended
  // at an earlier commit or was cancelled), so a grammar's matcher advances on exactly the
  // tokens its stream keeps. Returns how many tokens were appended.
  int commit(const StepBatch& batch, const StepSamples& samples, const std::vector<int32_t>& eos_ids,
             int64_t now_us, std::vector<GenerateStream*>& updated, std::vector<GenerateStream*>& ended,
             int32_t* appended = nullptr);
  int commit(const StepBatch& batch, const int32_t* tokens, const float* logprobs,
             const std::vector<int32_t>& eos_ids, int64_t now_us, std::vector<GenerateStream*>& updated,
             std::vector<GenerateStream*>& ended, int32_t* appended = nullptr) {
    return commit(batch, StepSamples{tokens, logprobs}, eos_ids, now_us, updated, ended, appended);
  }

  // The model runner failed: the streams of every step in flight (a step scheduled ahead
  // depends on the one before) end with `error` (blocks freed, removed); appended to `ended`.
  // Streams not in those steps are untouched.
  void fail_step(const ErrorInfo& error, int64_t now_us, std::vector<GenerateStream*>& ended);

  // A stream could be scheduled: one runs, or one waits whose grammar is not pending.
  bool has_runnable() const;
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  const std::deque<GenerateStream*>& waiting() const { return waiting_; }
  const std::vector<GenerateStream*>& running() const { return running_; }
  int64_t num_preemptions() const { return num_preemptions_; }
  const SpecStats& spec_stats() const { return spec_; }

 private:
  void preempt(GenerateStream* stream);
  // A finished stream no step holds any more: its blocks are freed, or exported (handoff_).
  void free_finished(GenerateStream* stream, int64_t now_us);
  bool can_run_ahead(const GenerateStream* stream, int64_t now_us) const;
  // How many tokens to draft after `stream`'s n scheduled ones (into draft_buf_), within `budget`.
  int draft(GenerateStream* stream, int n, int budget);
  // n of `stream`'s tokens, then `drafts` drafted ones from draft_buf_.
  void add_to_batch(StepBatch& batch, GenerateStream* stream, int n, int64_t now_us, int drafts = 0);
  // Appends row i's sampled tokens (rows from k on: 1, or with drafts up to 1 + draft_lens[i])
  // when `keep`; fills `appended` for them. Returns how many were appended.
  int append_samples(const StepBatch& batch, int i, const StepSamples& samples, int k, GenerateStream* stream,
                     bool keep, const std::vector<int32_t>& eos_ids, int64_t now_us, int32_t* appended);
  // Row i's penalty history: all of `stream`'s tokens (prompt, then generated), or none (null).
  void add_history(StepBatch& batch, int i, const GenerateStream* stream);
  // Row i's logit_bias entries: `stream`'s, or none (null).
  void add_bias(StepBatch& batch, int i, const GenerateStream* stream);
  // prompt_targets of `stream`'s n tokens from position `start`, at batch token index t0.
  static void add_prompt_targets(StepBatch& batch, int t0, const GenerateStream* stream, int start, int n);
  // Records row i's prompt log-probs from `samples`, its rows from *p on (advanced past them).
  static void record_prompt_rows(const StepBatch& batch, int i, const StepSamples& samples, GenerateStream* stream,
                                 bool keep, int* p);
  std::vector<GenerateStream*>& step(int age) { return steps_[(oldest_ + age) % kMaxStepsInFlight]; }
  void pop_oldest_step();

  SchedulerConfig config_;
  KVCacheManager& kv_;
  int max_seq_len_;
  std::deque<GenerateStream*> waiting_;
  std::vector<GenerateStream*> running_;  // admission order: the back is preempted first
  // Streams of the steps in flight, in batch order, oldest step first.
  std::vector<GenerateStream*> steps_[kMaxStepsInFlight];
  int oldest_ = 0, num_steps_ = 0;
  int64_t num_preemptions_ = 0;
  const Drafter* drafter_;
  KvHandoff* handoff_;
  std::vector<int32_t> draft_buf_;  // [max_drafts]: the drafts of the stream being added
  SpecStats spec_;
};

}  // namespace rtp_llm
