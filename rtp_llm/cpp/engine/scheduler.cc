#include "rtp_llm/cpp/engine/scheduler.h"

#include <algorithm>
#include <cassert>
#include <string>
#include <utility>

namespace rtp_llm {

Scheduler::Scheduler(SchedulerConfig config, KVCacheManager& kv, int max_seq_len, const Drafter* drafter,
                     KvHandoff* handoff)
    : config_(config), kv_(kv), max_seq_len_(max_seq_len), drafter_(drafter), handoff_(handoff) {
  if (drafter_ == nullptr) config_.max_drafts = 0;
  draft_buf_.resize(std::max(config_.max_drafts, 0));
  running_.reserve(config.max_batch_size);
  for (auto& streams : steps_) streams.reserve(config.max_batch_size);
}

void Scheduler::remove(GenerateStream* stream) {
  assert(!stream->in_flight);
  auto it = std::find(waiting_.begin(), waiting_.end(), stream);
  if (it != waiting_.end()) {
    waiting_.erase(it);
  } else {
    running_.erase(std::remove(running_.begin(), running_.end(), stream), running_.end());
  }
  kv_.free(stream->block_table);
}

void Scheduler::free_finished(GenerateStream* stream, int64_t now_us) {
  if (handoff_ != nullptr && stream->exports_kv()) {
    handoff_->adopt(stream->id(), std::exchange(stream->block_table, BlockTable{}),
                    static_cast<int>(stream->kv_export_blocks.size()), now_us);
  } else {
    kv_.free(stream->block_table);
  }
}

void Scheduler::preempt(GenerateStream* stream) {
  kv_.free(stream->block_table);
  stream->num_computed = 0;
  stream->set_status(StreamStatus::WAITING);
  waiting_.push_front(stream);
  ++num_preemptions_;
}

namespace {
// Whether the sampler reads the stream's history (penalties, n-gram bans).
bool has_penalties(const GenerateConfig& c) {
  return c.repetition_penalty != 1.0f || c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f ||
         c.no_repeat_ngram_size > 0;
}

// Whether every position of a verification step samples from the distribution the plain step
// would: the logits processed per row by penalties (each row's history counts the drafts before
// it: ops/draft_rows.py), logit_bias, temperature, top-k, top-p and min-p (greedy rows compare
// their argmax with the draft; the others verify it by rejection sampling, which keeps that
// distribution: models_py/rejection_sampler.py). Grammars (the matcher advances at commit),
// thinking budgets (a forced token depends on the tokens before) and prompt log-probs do not
// draft.
bool may_draft(const GenerateStream* s) {
  const GenerateConfig& c = s->config();
  return !c.force_disable_sp_run && c.grammar.empty() && !s->wants_prompt_logprobs() &&
         !(c.in_think_mode && c.max_thinking_tokens > 0);
}
}  // namespace

bool Scheduler::can_run_ahead(const GenerateStream* s, int64_t now_us) const {
  // Timed out: sitting out lets expire() end it once the step in flight commits.
  if (s->cancel_requested || s->timed_out(now_us)) return false;
  if (s->pending_drafts > 0) return false;  // how many tokens it keeps is known at commit only
  if (s->pending_sampled == 0) return true;  // its next tokens are known (a prompt chunk)
  // A stream that may draft drafts from its known tokens: it waits for the one in flight.
  if (config_.max_drafts > 0 && may_draft(s)) return false;
  if (s->may_force_after_next()) return false;
  const GenerateConfig& c = s->config();
  if (c.can_use_pd_separation) return false;  // it ends with the token in flight (handed off)
  return s->num_generated() + 1 < c.max_new_tokens && s->num_tokens() + 1 < s->max_seq_len();  // not sure to finish
}

void Scheduler::add_history(StepBatch& b, int i, const GenerateStream* s) {
  b.history_starts[i] = b.num_history_tokens;
  b.history_lens[i] = 0;
  if (s == nullptr) return;
  // Complete: schedule() runs nothing ahead while such a stream samples (pending_sampled 0).
  assert(s->pending_sampled == 0);
  const int n = s->num_tokens();
  assert(static_cast<size_t>(b.num_history_tokens + n) <= b.history_tokens.size());
  std::copy(s->tokens().begin(), s->tokens().end(), b.history_tokens.begin() + b.num_history_tokens);
  b.history_lens[i] = n;
  b.num_history_tokens += n;
}

void Scheduler::add_bias(StepBatch& b, int i, const GenerateStream* s) {
  b.bias_starts[i] = b.num_bias_entries;
  b.bias_lens[i] = 0;
  if (s == nullptr) return;
  const auto& bias = s->config().logit_bias;
  const int n = static_cast<int>(bias.size());  // <= RTP_LLM_MAX_LOGIT_BIAS (validated at enqueue)
  assert(static_cast<size_t>(b.num_bias_entries + n) <= b.bias_tokens.size());
  for (int j = 0; j < n; ++j) {
    b.bias_tokens[b.num_bias_entries + j] = bias[j].first;
    b.bias_values[b.num_bias_entries + j] = bias[j].second;
  }
  b.bias_lens[i] = n;
  b.num_bias_entries += n;
}

void Scheduler::add_prompt_targets(StepBatch& b, int t0, const GenerateStream* s, int start, int n) {
  int32_t* targets = b.prompt_targets.data() + t0;
  std::fill(targets, targets + n, -1);
  if (!s->wants_prompt_logprobs()) return;
  // Token q's log-prob comes from position q - 1's logits; q = 0 has none, and the last prompt
  // position's next token is sampled (do_sample), not a prompt token.
  const int from = std::max(start, s->prompt_logprobs_next() - 1);
  const int to = std::min(start + n, s->prompt_len() - 1);
  for (int pos = from; pos < to; ++pos) targets[pos - start] = s->tokens()[pos + 1];
  b.num_prompt_logprobs += std::max(0, to - from);
}

void Scheduler::record_prompt_rows(const StepBatch& b, int i, const StepSamples& samples, GenerateStream* s,
                                   bool keep, int* p) {
  for (int t = b.query_starts[i]; t < b.query_starts[i + 1]; ++t) {
    if (b.prompt_targets[t] < 0) continue;
    const int r = (*p)++;
    if (!keep || samples.prompt_logprobs == nullptr) continue;
    const size_t off = static_cast<size_t>(r) * samples.prompt_top_k;
    s->record_prompt_logprob(b.positions[t] + 1, samples.prompt_logprobs[r],
                             samples.prompt_top_ids ? samples.prompt_top_ids + off : nullptr,
                             samples.prompt_top_logprobs ? samples.prompt_top_logprobs + off : nullptr,
                             samples.prompt_top_k);
  }
}

int Scheduler::draft(GenerateStream* s, int n, int budget) {
  // Only a decode whose last token is known: n is that one token and nothing of it is in flight.
  if (config_.max_drafts == 0 || n != 1 || s->pending_sampled > 0 || s->scheduled_computed() != s->num_tokens() - 1 ||
      !may_draft(s)) {
    return 0;
  }
  // Accepting all d drafts appends d + 1 tokens: they must fit max_new_tokens and max_seq_len.
  const int room = std::min(s->config().max_new_tokens - s->num_generated(), s->max_seq_len() - s->num_tokens()) - 1;
  const int allowance = config_.fixed_drafts ? config_.max_drafts : s->draft_pace.allowance(config_.max_drafts);
  const int most = std::min({allowance, budget - n, room});
  if (most <= 0) return 0;
  const int d = drafter_->propose(s->tokens().data(), s->num_tokens(), most, draft_buf_.data());
  // Drafts never preempt: without the blocks for them, the stream decodes as usual.
  return d > 0 && kv_.can_grow(s->block_table, s->scheduled_computed() + n + d) ? d : 0;
}

void Scheduler::add_to_batch(StepBatch& b, GenerateStream* s, int n, int64_t now_us, int drafts) {
  const int i = b.num_streams++;
  const int start = s->scheduled_computed();
  // Positions >= known: the drafts (drafts > 0), else the placeholder of a pending sample.
  const int known = s->num_tokens();
  const int bs = kv_.block_size();
  const int sample = start + n == s->scheduled_tokens() ? 1 : 0;
  const int row = b.num_sampled + b.num_draft_tokens;  // its first row among the step's sampled rows
  const int q = n + drafts;
  b.stream_ids[i] = s->id();
  b.query_lens[i] = q;
  b.prefix_lens[i] = start;
  b.context_lens[i] = start + q;
  b.query_starts[i + 1] = b.query_starts[i] + q;
  b.do_sample[i] = sample;
  b.draft_lens[i] = drafts;
  b.num_sampled += sample;
  b.num_draft_tokens += drafts;
  if (n > 1 || start < s->prompt_len()) ++b.num_prefill;

  const int32_t* tokens = s->tokens().data();
  const int32_t* blocks = s->block_table.blocks.data();
  for (int j = 0, t = b.num_tokens; j < q; ++j, ++t) {
    const int pos = start + j;
    b.token_ids[t] = pos < known ? tokens[pos] : drafts > 0 ? draft_buf_[pos - known] : -1 - s->pending_row;
    b.positions[t] = pos;
    b.slot_mapping[t] = int64_t{blocks[pos / bs]} * bs + pos % bs;
  }
  add_prompt_targets(b, b.num_tokens, s, start, q);
  b.num_tokens += q;
  b.block_table_stride = std::max(b.block_table_stride, kv_.blocks_for(start + q));

  const GenerateConfig& c = s->config();
#define RTP_LLM_COPY_PARAM(type, name, ...) b.name[i] = c.name;
  RTP_LLM_ALL_SAMPLING(RTP_LLM_COPY_PARAM)
#undef RTP_LLM_COPY_PARAM
  b.num_generated[i] = s->num_generated() + s->pending_sampled;
  b.grammar[i] = c.grammar.empty() ? 0 : 1;
  b.num_grammar += sample & b.grammar[i];
  add_history(b, i, sample && has_penalties(c) ? s : nullptr);
  add_bias(b, i, sample ? s : nullptr);
  // Exact: a stream whose sample may be forced does not run ahead (pending_sampled is 0 then).
  b.forced_tokens[i] = sample ? s->forced_token() : -1;

  ++s->in_flight;
  s->pending_computed += q;
  s->pending_drafts = drafts;
  s->pending_sampled += sample;
  if (sample) s->pending_row = row;
  s->mark_scheduled(now_us);
  step(num_steps_).push_back(s);
}

void Scheduler::pop_oldest_step() {
  step(0).clear();
  oldest_ = (oldest_ + 1) % kMaxStepsInFlight;
  --num_steps_;
}

void Scheduler::fail_step(const ErrorInfo& error, int64_t now_us, std::vector<GenerateStream*>& ended) {
  while (num_steps_ > 0) {
    for (GenerateStream* s : step(0)) {
      s->in_flight = s->pending_computed = s->pending_sampled = s->pending_drafts = 0;
      if (!s->done()) {  // a stream that ended at an earlier commit was reported then
        s->finish(StreamStatus::ERROR, error, now_us);
        ended.push_back(s);
      }
      kv_.free(s->block_table);
    }
    pop_oldest_step();
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](GenerateStream* s) { return s->done(); }),
                 running_.end());
}

void Scheduler::expire(int64_t now_us, std::vector<GenerateStream*>& ended) {
  auto expired = [&](GenerateStream* s) {
    if (s->in_flight || !s->timed_out(now_us)) return false;
    s->finish(StreamStatus::ERROR,
              {ErrorCode::GENERATE_TIMEOUT, "request timed out after timeout_ms=" + std::to_string(s->config().timeout_ms),
               "timeout_ms"},
              now_us);
    kv_.free(s->block_table);
    ended.push_back(s);
    return true;
  };
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), expired), waiting_.end());
  running_.erase(std::remove_if(running_.begin(), running_.end(), expired), running_.end());
}

void Scheduler::schedule(StepBatch& b, int64_t now_us) {
  assert(num_steps_ < kMaxStepsInFlight);
  b.clear();
  const bool ahead = num_steps_ > 0;
  if (ahead) {
    // A stream with penalties needs its token in the history before it samples again: rather
    // than let it run every other step, the engine steps in turn while one runs.
    for (const GenerateStream* s : running_) {
      if (s->pending_sampled > 0 && has_penalties(s->config())) return;
    }
  }
  int budget = config_.max_num_batched_tokens;
  int prompt_rows = config_.max_prompt_rows;  // what is left of it: see SchedulerConfig
  bool preempted = false;

  for (size_t i = 0; i < running_.size() && budget > 0 && b.num_streams < config_.max_batch_size;) {
    GenerateStream* s = running_[i];
    const int n = std::min({s->scheduled_tokens() - s->scheduled_computed(), budget,
                            s->needs_prompt_rows() ? prompt_rows : budget});
    if (n == 0 && s->needs_prompt_rows()) {
      ++i;  // the prompt rows' budget is spent: it goes on next step
      continue;
    }
    if (ahead && (n <= 0 || !can_run_ahead(s, now_us))) {  // (n < 0: its drafts are in flight)
      ++i;  // it runs again once the step in flight has committed
      continue;
    }
    if (ahead && !kv_.can_grow(s->block_table, s->scheduled_computed() + n)) {
      preempted = true;  // short of blocks: admit nobody, so the next regular step can preempt
      ++i;
      continue;
    }
    bool self_preempted = false;
    while (!kv_.can_grow(s->block_table, s->num_computed + n)) {
      GenerateStream* victim = running_.back();  // never one already in this batch (index < i)
      running_.pop_back();
      preempt(victim);
      preempted = true;
      if (victim == s) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;
    const int drafts = draft(s, n, budget);
    kv_.grow(s->block_table, s->scheduled_computed() + n + drafts);
    add_to_batch(b, s, n, now_us, drafts);
    budget -= n + drafts;
    if (s->needs_prompt_rows()) prompt_rows -= n;
    ++i;
  }

  // Admit waiting streams in arrival order, passing over those whose grammar is still
  // compiling; none after a preemption (blocks are short).
  // (Ahead of a step in flight, `preempted` means a running stream was short of blocks.)
  for (auto it = waiting_.begin();
       !preempted && it != waiting_.end() && budget > 0 && b.num_streams < config_.max_batch_size;) {
    GenerateStream* s = *it;
    // A stream that still needs prompt log-probs runs its whole prompt (no cache hit), within
    // what is left of the prompt rows' budget.
    const bool lookup = !s->needs_prompt_rows();
    if (s->held() || (!lookup && prompt_rows == 0)) {
      ++it;
      continue;
    }
    PrefixMatch match = lookup ? kv_.match_prefix(s->tokens().data(), s->num_tokens()) : PrefixMatch{};
    const int cached = match.num_tokens(kv_.block_size());
    const int n = std::min({s->num_tokens() - cached, budget, lookup ? budget : prompt_rows});
    if (!kv_.can_allocate(s->block_table, match, cached + n)) break;
    kv_.allocate(s->block_table, match, cached + n);
    if (s->timing().first_scheduled_us == 0 && lookup) {
      s->set_reuse_len(cached);
      kv_.record_lookup(s->prompt_len(), cached);
    }
    s->num_computed = cached;
    s->set_status(StreamStatus::RUNNING);
    it = waiting_.erase(it);
    running_.push_back(s);
    add_to_batch(b, s, n, now_us);
    budget -= n;
    if (!lookup) prompt_rows -= n;
  }

  // Block tables last: the row stride is the longest table in the batch.
  const std::vector<GenerateStream*>& scheduled = step(num_steps_);
  if (b.num_streams > 0) ++num_steps_;
  const int stride = b.block_table_stride;
  for (int i = 0; i < b.num_streams; ++i) {
    const auto& blocks = scheduled[i]->block_table.blocks;
    const int used = kv_.blocks_for(b.context_lens[i]);
    int32_t* row = b.block_tables.data() + static_cast<size_t>(i) * stride;
    std::copy(blocks.begin(), blocks.begin() + used, row);
    std::fill(row + used, row + stride, 0);
  }
}

bool Scheduler::has_runnable() const {
  return !running_.empty() ||
         std::any_of(waiting_.begin(), waiting_.end(), [](const GenerateStream* s) { return !s->held(); });
}

int Scheduler::append_samples(const StepBatch& b, int i, const StepSamples& samples, int k, GenerateStream* s,
                              bool keep, const std::vector<int32_t>& eos_ids, int64_t now_us, int32_t* appended) {
  const int d = b.draft_lens[i];
  const int32_t* drafts = b.token_ids.data() + b.query_starts[i + 1] - d;
  // Row j samples the token after the stream's j-th query position: the drafts are accepted
  // while each equals the row before it, and the row after the last accepted one is kept too.
  int accepted = 0;
  while (accepted < d && samples.tokens[k + accepted] == drafts[accepted]) ++accepted;
  int count = 0;
  for (int j = 0; j <= d; ++j) {
    const bool take = keep && j <= accepted && !s->done();  // nothing after a stop
    if (appended != nullptr) appended[k + j] = take ? 1 : 0;
    if (!take) continue;
    SampledToken sampled{samples.tokens[k + j], samples.logprobs ? samples.logprobs[k + j] : 0.0f};
    if (samples.top_k > 0 && samples.top_ids != nullptr && samples.top_logprobs != nullptr) {
      sampled.top_ids = samples.top_ids + static_cast<size_t>(k + j) * samples.top_k;
      sampled.top_logprobs = samples.top_logprobs + static_cast<size_t>(k + j) * samples.top_k;
      sampled.num_top = samples.top_k;
    }
    s->append(sampled, eos_ids, now_us);
    ++count;
  }
  if (d > 0) {
    // The positions of rejected drafts hold no kept token: computed again (overwritten) next step.
    s->num_computed -= d - accepted;
    if (keep) {
      s->spec().record(d, accepted);
      s->draft_pace.record(d, accepted, config_.max_drafts);
      ++spec_.draft_rounds;
      spec_.draft_tokens += d;
      spec_.accepted_tokens += accepted;
    }
  }
  return count;
}

int Scheduler::commit(const StepBatch& b, const StepSamples& samples, const std::vector<int32_t>& eos_ids,
                      int64_t now_us, std::vector<GenerateStream*>& updated, std::vector<GenerateStream*>& ended,
                      int32_t* appended) {
  assert(num_steps_ > 0);
  const std::vector<GenerateStream*>& scheduled = step(0);
  int k = 0, p = 0, count = 0;
  bool any_ended = false;
  for (int i = 0; i < b.num_streams; ++i) {
    GenerateStream* s = scheduled[i];
    const bool was_done = s->done();  // ended at an earlier commit; this was its ahead step
    record_prompt_rows(b, i, samples, s, !was_done && !s->cancel_requested, &p);
    --s->in_flight;
    s->num_computed += b.query_lens[i];
    s->pending_computed -= b.query_lens[i];
    s->pending_drafts = 0;
    if (b.do_sample[i]) {
      --s->pending_sampled;
      const bool keep = !s->cancel_requested && !was_done;
      count += append_samples(b, i, samples, k, s, keep, eos_ids, now_us, appended);
      k += 1 + b.draft_lens[i];
      if (keep) updated.push_back(s);
    }
    // After the append: the tokens of accepted drafts are in tokens() now. (A stop inside an
    // accepted run leaves num_computed past the tokens kept: clamped, the stream is done.)
    s->num_computed = std::min(s->num_computed, s->num_tokens());
    if (!was_done) kv_.publish_computed(s->block_table, s->tokens().data(), s->num_computed);
    if (s->cancel_requested && !s->done()) s->finish(StreamStatus::CANCELLED, {ErrorCode::CANCELLED, "cancelled"}, now_us);
    if (s->done()) {
      if (!was_done && s->exports_kv()) {
        const int full = s->prompt_len() / kv_.block_size();
        s->kv_export_blocks.assign(s->block_table.blocks.begin(), s->block_table.blocks.begin() + full);
      }
      // Its blocks stay until no step in flight writes them.
      if (s->in_flight == 0) free_finished(s, now_us);
      if (!was_done) {
        ended.push_back(s);
        any_ended = true;
      }
    } else if (b.draft_lens[i] > 0) {
      assert(s->in_flight == 0);
      kv_.shrink(s->block_table, s->num_tokens());  // blocks only rejected drafts reached (none in flight)
    }
  }
  if (any_ended) {
    running_.erase(std::remove_if(running_.begin(), running_.end(), [](GenerateStream* s) { return s->done(); }),
                   running_.end());
  }
  pop_oldest_step();
  return count;
}

}  // namespace rtp_llm
