// The engine core as a library: admission, scheduling and bookkeeping of streams, thread-safe.
// One thread drives steps (schedule -> model -> commit); any thread enqueues, aborts, polls.
// Listeners (the gRPC server's call reactors) are told about new tokens on a dispatcher
// thread, so the stepping thread never waits on the network.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "rtp_llm/cpp/cache/kv_cache_manager.h"
#include "rtp_llm/cpp/engine/generate_stream.h"
#include "rtp_llm/cpp/engine/kv_handoff.h"
#include "rtp_llm/cpp/engine/scheduler.h"
#include "rtp_llm/cpp/engine/step_batch.h"
#include "rtp_llm/cpp/engine/step_batch_fields.h"

namespace rtp_llm {

// Fields, defaults and minimums: RTP_LLM_ENGINE_CONFIG (step_batch_fields.h).
struct EngineCoreConfig {
#define RTP_LLM_CONFIG_MEMBER(type, name, def, min) RTP_LLM_CTYPE(type) name = def;
  RTP_LLM_ENGINE_CONFIG(RTP_LLM_CONFIG_MEMBER)
#undef RTP_LLM_CONFIG_MEMBER
  std::vector<int32_t> eos_token_ids;

  ErrorInfo validate() const;  // names the field at fault
};

// A stream as seen by a reader: what was generated since its cursor, and the outcome.
struct StreamUpdate {
  std::vector<int32_t> new_tokens;  // generated tokens from the reader's cursor on
  std::vector<float> new_logprobs;  // same length when the request asked for log-probs
  int top_logprobs = 0;             // alternatives per new token (the request's top_logprobs)
  std::vector<int32_t> new_top_ids;  // [new_tokens, top_logprobs], best first
  std::vector<float> new_top_logprobs;
  // Prompt log-probs (the request's prompt_logprobs k >= 0), in the update that carries the
  // first generated tokens (cursor 0): tokens 1.. of the prompt [prompt_len - 1], their k best
  // alternatives [prompt_len - 1, k]; empty in every other update.
  int prompt_top_logprobs = 0;
  std::vector<float> prompt_logprobs;
  std::vector<int32_t> prompt_top_ids;
  std::vector<float> prompt_top_lps;
  int num_generated = 0;
  int prompt_len = 0;
  StreamStatus status = StreamStatus::WAITING;
  ErrorInfo error;
  std::string finish_reason;  // GenerateStream::finish_reason(), sent as AuxInfoPB.finish_reason
  StreamTiming timing;
  StreamSpecStats spec;
  // Prefill/decode disaggregation (the stream's last update): the prompt's full blocks it left
  // for a decode instance (export id = the stream's id), and where they live (set_kv_source).
  std::vector<int32_t> kv_export_blocks;
  bool kv_exported = false;
  int64_t kv_export_id = 0;
  int block_size = 0;
  std::string kv_source;
  bool done() const { return status >= StreamStatus::FINISHED; }
};

// Grammars since start (the engine process compiles them and reports each in grammar_done).
struct GrammarStats {
  int64_t requests = 0;    // streams enqueued with a grammar
  int64_t cache_hits = 0;  // of those, whose grammar was compiled (or compiling) already
  int64_t compiles = 0;    // grammars compiled
  int64_t compile_us = 0;  // their compile time, summed
  int64_t failures = 0;    // streams whose grammar failed to compile or timed out
};

struct EngineStats {
  int running, waiting, tracked_streams;
  KVCacheStats kv;
  int64_t steps, preemptions, finished;
  int64_t generated_tokens;  // tokens appended to streams, since start
  GrammarStats grammar;
  SpecStats spec;
  int kv_exports;
  int64_t kv_exports_expired;
  KvTransferStats kv_transfer;
};

class EngineCore {
 public:
  using Listener = std::function<void()>;

  explicit EngineCore(EngineCoreConfig config);  // precondition: config.validate().ok()
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  const EngineCoreConfig& config() const { return config_; }
  // The step batch's array sizes (every batch is preallocated to them).
  const StepBatchCapacity& capacity() const { return capacity_; }

  // Admits a request or says why it can never run (empty or too long prompt, bad params).
  // max_waiting > 0: refuses it (CONCURRENCY_LIMIT_ERROR) when that many streams already wait,
  // so a caller can bound the queue; checked under the lock, so concurrent callers cannot
  // overshoot it.
  // handover (a DECODE instance's request, may be null): the tokens a PREFILL instance generated,
  // which the stream continues after (GenerateStream::resume; refused, "generated_token_ids", when
  // they finish it), and its export: the stream waits until next_kv_import's reader is done.
  ErrorInfo enqueue(std::vector<int32_t> prompt, GenerateConfig config, int64_t* id, int max_waiting = 0,
                    KvHandover* handover = nullptr);
  // The next step. Empty (num_streams == 0) when there is nothing to run. While a batch is
  // uncommitted, returns it again. A batch is valid until the second schedule() after it.
  const StepBatch& schedule();
  // Overlap: with one batch uncommitted (running on the device), schedules the next one
  // ahead of its result (see scheduler.h: placeholders -1 - row stand for the tokens the
  // running batch samples). With none uncommitted it is schedule(); with two, an empty batch.
  const StepBatch& schedule_ahead();
  // Sampled tokens of the oldest uncommitted batch's sampled rows, in batch order (n ==
  // num_sampled + num_draft_tokens: per do_sample stream its last 1 + draft_lens rows), with their log-probs and alternatives (scheduler.h). appended (may be
  // null, else n entries): 1 where the token was appended, 0 where dropped (see
  // Scheduler::commit).
  ErrorInfo commit(const StepSamples& samples, int n, int32_t* appended = nullptr);
  ErrorInfo commit(const int32_t* tokens, const float* logprobs, int n, int32_t* appended = nullptr) {
    return commit(StepSamples{tokens, logprobs}, n, appended);
  }
  // Instead of commit(): the model runner failed. The streams of every uncommitted batch
  // end with EXECUTION_EXCEPTION and `message`; every other stream carries on.
  ErrorInfo fail_batch(const std::string& message);
  // Blocks until there is work (a stream that could be scheduled, or a grammar to compile),
  // or `timeout_ms` passes, or stop(). True if work.
  bool wait_for_work(int timeout_ms);

  // Grammars. A stream enqueued with one waits unadmitted until grammar_done(). The engine
  // process takes each stream's grammar to compile (next_grammar: false when none is left;
  // streams that ended meanwhile are skipped), then reports it: error.ok() lets the stream be
  // scheduled; otherwise it ends with `error` (naming the grammar field). compile_us: the
  // compile this stream started (0 for a cache hit). Thread-safe like the rest.
  bool next_grammar(int64_t* id, std::string* field, std::string* spec);
  void grammar_done(int64_t id, const ErrorInfo& error, int64_t compile_us, bool cache_hit);
  // Ids of streams with a grammar that ended since the last call (their matchers can go).
  void take_ended_grammars(std::vector<int64_t>* out);
  // Cancels a stream (its blocks are freed now, or at commit() if in flight). False if unknown.
  bool abort(int64_t id);
  // Copies the stream's state from generated token `from` on. False if unknown.
  bool poll(int64_t id, int from, StreamUpdate* out);
  // All of a stream's tokens (prompt, then generated) and its prompt length. False if unknown.
  bool tokens(int64_t id, std::vector<int32_t>* out, int* prompt_len);
  // Forgets a stream, aborting it if unfinished. Readers call it once they are done.
  void release(int64_t id);
  // Called (on the dispatcher thread) whenever the stream gets tokens or ends.
  void set_listener(int64_t id, Listener listener);
  EngineStats stats();

  // Prefill/decode disaggregation (kv_handoff.h). PREFILL: the transfer engine's description of
  // this instance's KV pool, sent with every export; release_export: a decode instance read
  // export `id` (unknown ids are ignored). DECODE: next_kv_import waits up to timeout_ms for a
  // stream whose prompt's blocks are to be read, reserves the blocks to read them into and
  // returns the read (false: none came); kv_import_done(ok) publishes them and lets the stream
  // run (not ok: it recomputes what was not read). Any number of readers may wait at once.
  void set_kv_source(std::string source);
  void release_export(int64_t id);
  bool next_kv_import(int timeout_ms, KvImportJob* job);
  void kv_import_done(int64_t stream_id, bool ok, int64_t bytes = 0, int64_t us = 0);
  // Wakes wait_for_work() for good; later calls return false immediately.
  void stop();
  // The clock of StreamTiming (steady, microseconds).
  static int64_t now_us();

 private:
  using ListenerPtr = std::shared_ptr<Listener>;
  void notify(const std::vector<GenerateStream*>& streams);  // with mu_ held
  void dispatch_loop();
  const StepBatch& schedule_locked();                          // with mu_ held
  void erase_released();                                     // with mu_ held
  void count_ended(const std::vector<GenerateStream*>& ended);  // with mu_ held

  EngineCoreConfig config_;
  StepBatchCapacity capacity_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  KVCacheManager kv_;
  KvHandoff handoff_;  // before scheduler_, which uses it
  std::string kv_source_;
  std::deque<int64_t> kv_import_queue_;  // streams whose prompt's blocks are to be read
  std::condition_variable kv_import_cv_;
  std::unique_ptr<Drafter> drafter_;  // speculative decoding's (null: off); before scheduler_, which uses it
  Scheduler scheduler_;
  // Batches of the steps in flight (at most two: see schedule_ahead), oldest first.
  StepBatch batches_[Scheduler::kMaxStepsInFlight];
  int oldest_ = 0, outstanding_ = 0;
  StepBatch empty_;
  bool stopped_ = false;
  int64_t next_id_ = 1;
  int64_t steps_ = 0, finished_ = 0, generated_tokens_ = 0;
  std::unordered_map<int64_t, std::unique_ptr<GenerateStream>> streams_;
  std::unordered_map<int64_t, ListenerPtr> listeners_;
  std::vector<GenerateStream*> updated_, ended_;  // scratch, reused every step
  std::vector<int64_t> release_pending_;          // released while in flight: erased once not
  std::deque<int64_t> grammar_queue_;             // streams whose grammar is to be compiled
  std::vector<int64_t> ended_grammars_;           // streams with a grammar that ended (take_ended_grammars)
  GrammarStats grammar_;

  std::mutex dispatch_mu_;
  std::condition_variable dispatch_cv_;
  std::deque<ListenerPtr> dispatch_queue_;
  bool dispatch_stop_ = false;
  std::thread dispatcher_;
};

}  // namespace rtp_llm
