#include "rtp_llm/cpp/engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>

namespace rtp_llm {

ErrorInfo EngineCoreConfig::validate() const {
#define RTP_LLM_CHECK_MIN(type, name, def, min) \
  if (name < min) return invalid(#name, #name " must be >= " #min ", got " + std::to_string(name));
  RTP_LLM_ENGINE_CONFIG(RTP_LLM_CHECK_MIN)
#undef RTP_LLM_CHECK_MIN
  // The step's penalty history holds up to max_batch_size * max_seq_len tokens, indexed by
  // int32 (history_starts, num_history_tokens): the product must fit.
  const int64_t history = static_cast<int64_t>(max_batch_size) * max_seq_len;
  if (history > INT32_MAX) {
    return invalid("max_seq_len", "max_batch_size * max_seq_len must be <= " + std::to_string(INT32_MAX) +
                                      ", got " + std::to_string(history));
  }
  // Likewise the logit-bias entries (bias_starts, num_bias_entries).
  if (static_cast<int64_t>(max_batch_size) * RTP_LLM_MAX_LOGIT_BIAS > INT32_MAX) {
    return invalid("max_batch_size", "max_batch_size must be <= " + std::to_string(INT32_MAX / RTP_LLM_MAX_LOGIT_BIAS));
  }
  if (sp_min_token_match > sp_max_token_match) {
    return invalid("sp_min_token_match", "sp_min_token_match (" + std::to_string(sp_min_token_match) +
                                             ") must be <= sp_max_token_match (" + std::to_string(sp_max_token_match) +
                                             ")");
  }
  if (gen_num_per_cycle >= max_num_batched_tokens) {
    return invalid("gen_num_per_cycle", "gen_num_per_cycle must be < max_num_batched_tokens (" +
                                            std::to_string(max_num_batched_tokens) + "), got " +
                                            std::to_string(gen_num_per_cycle));
  }
  return {};
}

namespace {
// The drafter the config asks for: a draft model's (positions the model runner fills), prompt
// lookup, or none.
std::unique_ptr<Drafter> make_drafter(const EngineCoreConfig& c) {
  if (c.gen_num_per_cycle <= 0) return nullptr;
  if (c.draft_model) return std::make_unique<DeferredDrafter>();
  return std::make_unique<NgramDrafter>(c.sp_min_token_match, c.sp_max_token_match);
}

SchedulerConfig scheduler_config(const EngineCoreConfig& c) {
  SchedulerConfig s;
  s.max_batch_size = c.max_batch_size;
  s.max_num_batched_tokens = c.max_num_batched_tokens;
  s.max_drafts = c.gen_num_per_cycle;
  s.fixed_drafts = c.sp_fixed_drafts != 0;
  return s;
}
}  // namespace

EngineCore::EngineCore(EngineCoreConfig config)
    : config_(std::move(config)),
      kv_(config_.num_blocks, config_.block_size, config_.reuse_cache != 0),
      handoff_(kv_, int64_t{config_.kv_export_timeout_ms > 0 ? config_.kv_export_timeout_ms : 30000} * 1000),
      drafter_(make_drafter(config_)),
      scheduler_(scheduler_config(config_), kv_, config_.max_seq_len, drafter_.get(), &handoff_) {
  // History: a penalized row copies at most max_seq_len tokens; logit bias: RTP_LLM_MAX_LOGIT_BIAS per row.
  capacity_ = {config_.max_batch_size, config_.max_num_batched_tokens, kv_.blocks_for(config_.max_seq_len),
               config_.max_batch_size * config_.max_seq_len, config_.max_batch_size * RTP_LLM_MAX_LOGIT_BIAS};
  for (StepBatch& b : batches_) b.reserve(capacity_);
  empty_.reserve({1, 1, 1, 1, 1});  // real (never written) buffers: views of it are mapped like any batch
  updated_.reserve(config_.max_batch_size);
  ended_.reserve(config_.max_batch_size);
  dispatcher_ = std::thread([this] { dispatch_loop(); });
}

EngineCore::~EngineCore() {
  stop();
  {
    std::lock_guard<std::mutex> lock(dispatch_mu_);
    dispatch_stop_ = true;
  }
  dispatch_cv_.notify_all();
  dispatcher_.join();
}

int64_t EngineCore::now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

ErrorInfo EngineCore::enqueue(std::vector<int32_t> prompt, GenerateConfig config, int64_t* id, int max_waiting,
                              KvHandover* handover) {
  static const std::vector<int32_t> kNone;
  const std::vector<int32_t>& generated = handover != nullptr ? handover->generated : kNone;
  const int len = static_cast<int>(prompt.size());
  if (len == 0) return invalid("token_ids", "token_ids must not be empty");
  // An id past the embedding would fail the whole step it runs in (on a GPU, the process).
  for (const auto& [field, ids] : {std::pair<const char*, const std::vector<int32_t>*>{"token_ids", &prompt},
                                   {"generated_token_ids", &generated}}) {
    for (const int32_t t : *ids) {
      if (t < 0 || (config_.vocab_size > 0 && t >= config_.vocab_size)) {
        return invalid(field, "token id " + std::to_string(t) + " is outside the model's vocabulary [0, " +
                                  std::to_string(config_.vocab_size) + ")");
      }
    }
  }
  ErrorInfo bad = config.validate();
  if (!bad.ok()) return bad;
  if (len >= config_.max_seq_len) {
    return {ErrorCode::LONG_PROMPT_ERROR,
            "prompt has " + std::to_string(len) + " tokens; max_seq_len is " + std::to_string(config_.max_seq_len) +
                " (room for at least one new token is needed)",
            "token_ids"};
  }
  // A stream may never need more blocks than the cache has, or it could wait forever.
  const int capacity = kv_.num_blocks() * kv_.block_size();
  if (len >= capacity) {
    return {ErrorCode::EXCEEDS_KV_CACHE_MAX_LEN,
            "prompt has " + std::to_string(len) + " tokens; the whole KV cache holds " + std::to_string(capacity),
            "token_ids"};
  }
  const int max_seq_len = std::min(config_.max_seq_len, capacity);

  std::lock_guard<std::mutex> lock(mu_);
  if (max_waiting > 0 && scheduler_.num_waiting() >= max_waiting) {
    return {ErrorCode::CONCURRENCY_LIMIT_ERROR,
            "the waiting queue is full (" + std::to_string(max_waiting) + " requests): try again later"};
  }
  const bool imports = handover != nullptr && !handover->blocks.empty();
  if (imports && handover->block_size != kv_.block_size()) {
    return invalid("kv_export", "the PREFILL instance's blocks hold " + std::to_string(handover->block_size) +
                                    " tokens, this instance's " + std::to_string(kv_.block_size()) +
                                    ": both need the same --seq_size_per_block");
  }
  const int64_t sid = next_id_++;
  auto stream = std::make_unique<GenerateStream>(sid, std::move(prompt), std::move(config), max_seq_len, now_us());
  if (!generated.empty() && !stream->resume(generated, config_.eos_token_ids, now_us())) {
    --next_id_;
    return invalid("generated_token_ids", "the request is already finished after its generated_token_ids");
  }
  if (imports) {
    stream->kv_import_pending = true;
    stream->kv_handover = std::move(*handover);
    kv_import_queue_.push_back(sid);
    kv_import_cv_.notify_one();
  }
  if (stream->grammar_pending) {
    grammar_queue_.push_back(sid);
    ++grammar_.requests;
  }
  scheduler_.add(stream.get());
  streams_.emplace(sid, std::move(stream));
  *id = sid;
  work_cv_.notify_all();
  return {};
}

const StepBatch& EngineCore::schedule() {
  std::lock_guard<std::mutex> lock(mu_);
  if (outstanding_ > 0) {
    // The latest batch was never committed: keep it (its streams are still in flight).
    return batches_[(oldest_ + outstanding_ - 1) % Scheduler::kMaxStepsInFlight];
  }
  return schedule_locked();
}

const StepBatch& EngineCore::schedule_ahead() {
  std::lock_guard<std::mutex> lock(mu_);
  if (outstanding_ == Scheduler::kMaxStepsInFlight) return empty_;
  return schedule_locked();
}

const StepBatch& EngineCore::schedule_locked() {
  const int64_t now = now_us();
  ended_.clear();
  scheduler_.expire(now, ended_);
  handoff_.expire(now);
  count_ended(ended_);
  notify(ended_);
  StepBatch& b = batches_[(oldest_ + outstanding_) % Scheduler::kMaxStepsInFlight];
  scheduler_.schedule(b, now);
  if (b.num_streams > 0) ++outstanding_;
  return b;
}

ErrorInfo EngineCore::commit(const StepSamples& samples, int n, int32_t* appended) {
  std::lock_guard<std::mutex> lock(mu_);
  if (outstanding_ == 0) return invalid("", "commit() without a scheduled batch");
  const StepBatch& b = batches_[oldest_];
  if (n != b.num_sampled + b.num_draft_tokens) {
    return invalid("", "commit() got " + std::to_string(n) + " tokens; the batch samples " +
                           std::to_string(b.num_sampled + b.num_draft_tokens) + " rows");
  }
  updated_.clear();
  ended_.clear();
  for (int k : {samples.top_k, samples.prompt_top_k}) {
    if (k < 0 || k > RTP_LLM_MAX_TOP_LOGPROBS) {
      return invalid("", "commit() got " + std::to_string(k) + " alternatives per token; at most " +
                             std::to_string(RTP_LLM_MAX_TOP_LOGPROBS));
    }
  }
  if (samples.num_prompt != b.num_prompt_logprobs || (b.num_prompt_logprobs > 0 && !samples.prompt_logprobs)) {
    return invalid("", "commit() got " + std::to_string(samples.num_prompt) + " prompt log-prob rows; the batch has " +
                           std::to_string(b.num_prompt_logprobs));
  }
  generated_tokens_ += scheduler_.commit(b, samples, config_.eos_token_ids, now_us(), updated_, ended_, appended);
  oldest_ = (oldest_ + 1) % Scheduler::kMaxStepsInFlight;
  --outstanding_;
  ++steps_;
  count_ended(ended_);
  notify(updated_);
  for (GenerateStream* s : ended_) {
    if (std::find(updated_.begin(), updated_.end(), s) == updated_.end()) notify({s});
  }
  erase_released();
  return {};
}

ErrorInfo EngineCore::fail_batch(const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (outstanding_ == 0) return invalid("", "fail_batch() without a scheduled batch");
  ended_.clear();
  scheduler_.fail_step({ErrorCode::EXECUTION_EXCEPTION, message}, now_us(), ended_);
  outstanding_ = 0;
  count_ended(ended_);
  notify(ended_);
  erase_released();
  return {};
}

void EngineCore::erase_released() {
  auto erased = [&](int64_t id) {
    auto it = streams_.find(id);
    if (it != streams_.end() && it->second->in_flight > 0) return false;  // an ahead step still holds it
    if (it != streams_.end()) streams_.erase(it);
    return true;
  };
  release_pending_.erase(std::remove_if(release_pending_.begin(), release_pending_.end(), erased),
                         release_pending_.end());
}

void EngineCore::count_ended(const std::vector<GenerateStream*>& ended) {
  finished_ += static_cast<int64_t>(ended.size());
  for (const GenerateStream* s : ended) {
    if (!s->config().grammar.empty()) ended_grammars_.push_back(s->id());
  }
}

bool EngineCore::wait_for_work(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  auto work = [&] { return !grammar_queue_.empty() || scheduler_.has_runnable(); };
  work_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return stopped_ || work(); });
  return !stopped_ && work();
}

bool EngineCore::next_grammar(int64_t* id, std::string* field, std::string* spec) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!grammar_queue_.empty()) {
    const int64_t sid = grammar_queue_.front();
    grammar_queue_.pop_front();
    auto it = streams_.find(sid);
    if (it == streams_.end() || it->second->done()) continue;  // released or ended meanwhile
    *id = sid;
    *field = it->second->config().grammar.field;
    *spec = it->second->config().grammar.spec;
    return true;
  }
  return false;
}

void EngineCore::grammar_done(int64_t id, const ErrorInfo& error, int64_t compile_us, bool cache_hit) {
  std::lock_guard<std::mutex> lock(mu_);
  grammar_.compiles += compile_us > 0 ? 1 : 0;
  grammar_.compile_us += compile_us;
  grammar_.cache_hits += cache_hit ? 1 : 0;
  grammar_.failures += error.ok() ? 0 : 1;
  auto it = streams_.find(id);
  if (it == streams_.end() || !it->second->grammar_pending) return;
  GenerateStream* s = it->second.get();
  s->grammar_pending = false;
  if (!error.ok() && !s->done()) {
    scheduler_.remove(s);  // still waiting: a pending stream is never admitted
    s->finish(StreamStatus::ERROR, error, now_us());
    count_ended({s});
    notify({s});
  }
  work_cv_.notify_all();
}

void EngineCore::take_ended_grammars(std::vector<int64_t>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out->swap(ended_grammars_);
  ended_grammars_.clear();
}

bool EngineCore::abort(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return false;
  GenerateStream* s = it->second.get();
  if (s->done()) return true;
  if (s->in_flight > 0) {
    s->cancel_requested = true;  // its KV is being written: commit() frees the blocks
    return true;
  }
  scheduler_.remove(s);
  s->finish(StreamStatus::CANCELLED, {ErrorCode::CANCELLED, "cancelled"}, now_us());
  count_ended({s});
  notify({s});
  return true;
}

bool EngineCore::poll(int64_t id, int from, StreamUpdate* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return false;
  const GenerateStream& s = *it->second;
  const int generated = s.num_generated();
  from = std::clamp(from, s.num_resumed(), generated);  // resumed tokens were sent by the instance that sampled them
  out->kv_exported = s.exports_kv();  // (the rest is copied only then: poll is on every stream's path)
  out->kv_export_id = s.id();
  out->block_size = kv_.block_size();
  if (out->kv_exported) {
    out->kv_export_blocks = s.kv_export_blocks;
    out->kv_source = kv_source_;
  } else {
    out->kv_export_blocks.clear();
    out->kv_source.clear();
  }
  out->new_tokens.assign(s.tokens().begin() + s.prompt_len() + from, s.tokens().end());
  if (s.config().return_logprobs) {
    out->new_logprobs.assign(s.logprobs().begin() + from, s.logprobs().end());
  } else {
    out->new_logprobs.clear();
  }
  const int k = s.config().top_logprobs;
  out->top_logprobs = k;
  out->new_top_ids.assign(s.top_ids().begin() + static_cast<size_t>(from) * k, s.top_ids().end());
  out->new_top_logprobs.assign(s.top_logprobs().begin() + static_cast<size_t>(from) * k, s.top_logprobs().end());
  const bool with_prompt = s.wants_prompt_logprobs() && from == 0 && generated > 0;
  out->prompt_top_logprobs = with_prompt ? s.config().prompt_logprobs : 0;
  out->prompt_logprobs.clear();
  out->prompt_top_ids.clear();
  out->prompt_top_lps.clear();
  if (with_prompt) {
    out->prompt_logprobs = s.prompt_logprobs();
    out->prompt_top_ids = s.prompt_top_ids();
    out->prompt_top_lps = s.prompt_top_logprobs();
  }
  out->num_generated = generated;
  out->prompt_len = s.prompt_len();
  out->status = s.status();
  out->error = s.error();
  out->finish_reason = s.finish_reason();
  out->timing = s.timing();
  out->spec = s.spec();
  return true;
}

bool EngineCore::tokens(int64_t id, std::vector<int32_t>* out, int* prompt_len) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return false;
  *out = it->second->tokens();
  *prompt_len = it->second->prompt_len();
  return true;
}

void EngineCore::release(int64_t id) {
  abort(id);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  listeners_.erase(id);
  if (it->second->in_flight > 0) {
    release_pending_.push_back(id);  // cancel pending: erased at its commit()
  } else {
    streams_.erase(it);
  }
}

void EngineCore::set_listener(int64_t id, Listener listener) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  auto ptr = std::make_shared<Listener>(std::move(listener));
  listeners_[id] = ptr;
  // Anything that happened before the listener existed must not be missed.
  if (it->second->num_generated() > 0 || it->second->done()) {
    std::lock_guard<std::mutex> dlock(dispatch_mu_);
    dispatch_queue_.push_back(std::move(ptr));
    dispatch_cv_.notify_one();
  }
}

EngineStats EngineCore::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return {scheduler_.num_running(), scheduler_.num_waiting(), static_cast<int>(streams_.size()), kv_.stats(),
          steps_,                   scheduler_.num_preemptions(), finished_, generated_tokens_,
          grammar_,                 scheduler_.spec_stats(), handoff_.num_exports(), handoff_.expired(), handoff_.stats()};
}

void EngineCore::set_kv_source(std::string source) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_source_ = std::move(source);
}

void EngineCore::release_export(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  handoff_.release(id, now_us());
}

bool EngineCore::next_kv_import(int timeout_ms, KvImportJob* job) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    while (!kv_import_queue_.empty()) {
      const int64_t id = kv_import_queue_.front();
      kv_import_queue_.pop_front();
      auto it = streams_.find(id);
      if (it == streams_.end() || it->second->done()) continue;  // ended while it waited
      GenerateStream& s = *it->second;
      const KvImport imp = handoff_.begin_import(id, s.tokens().data(), s.num_tokens(),
                                                 static_cast<int>(s.kv_handover.blocks.size()));
      job->stream_id = id;
      job->waited_us = now_us() - s.timing().enqueue_us;
      job->source = s.kv_handover.source;
      job->remote.assign(s.kv_handover.blocks.begin() + imp.num_cached,
                         s.kv_handover.blocks.begin() + imp.num_cached + imp.fresh.size());
      job->local = imp.fresh;
      return true;
    }
    if (stopped_) return false;
    if (kv_import_cv_.wait_until(lock, deadline) == std::cv_status::timeout && kv_import_queue_.empty()) return false;
  }
}

void EngineCore::kv_import_done(int64_t stream_id, bool ok, int64_t bytes, int64_t us) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    handoff_.end_import(stream_id, ok, bytes, us);
    auto it = streams_.find(stream_id);
    if (it != streams_.end()) it->second->kv_import_pending = false;
  }
  work_cv_.notify_all();
}

void EngineCore::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  work_cv_.notify_all();
  kv_import_cv_.notify_all();
}

void EngineCore::notify(const std::vector<GenerateStream*>& streams) {
  if (listeners_.empty() || streams.empty()) return;
  std::lock_guard<std::mutex> dlock(dispatch_mu_);
  for (GenerateStream* s : streams) {
    auto it = listeners_.find(s->id());
    if (it != listeners_.end()) dispatch_queue_.push_back(it->second);
  }
  dispatch_cv_.notify_one();
}

void EngineCore::dispatch_loop() {
  std::vector<ListenerPtr> work;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(dispatch_mu_);
      dispatch_cv_.wait(lock, [&] { return dispatch_stop_ || !dispatch_queue_.empty(); });
      if (dispatch_stop_ && dispatch_queue_.empty()) return;
      work.assign(dispatch_queue_.begin(), dispatch_queue_.end());
      dispatch_queue_.clear();
    }
    for (auto& listener : work) (*listener)();
    work.clear();
  }
}

}  // namespace rtp_llm
