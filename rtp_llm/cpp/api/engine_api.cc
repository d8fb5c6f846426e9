#include "rtp_llm/cpp/api/engine_api.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "rtp_llm/cpp/engine/engine_core.h"
#include "rtp_llm/cpp/engine/fill_worker.h"
#include "rtp_llm/cpp/model_rpc/proto_convert.h"
#include "rtp_llm/cpp/model_rpc/rpc_server.h"

struct RtpEngine {
  std::unique_ptr<rtp_llm::EngineCore> engine;
  std::unique_ptr<rtp_llm::RpcServer> server;
  // One view per batch buffer the engine has handed out (see EngineCore::schedule_ahead).
  RtpStepBatch views[4]{};
  // A grammar taken from the engine that did not fit the caller's buffer: handed out first.
  struct Grammar {
    int64_t id = 0;
    std::string field, spec;
  };
  std::deque<Grammar> held_grammars;
  std::vector<int64_t> ended_grammars;  // taken from the engine, not yet handed out
};

struct RtpFillWorker {
  rtp_llm::FillWorker worker;
};

namespace {

using rtp_llm::ErrorCode;
using rtp_llm::ErrorInfo;

void write_error(const std::string& message, char* err, int32_t err_len) {
  if (err == nullptr || err_len <= 0) return;
  const size_t n = std::min(message.size(), static_cast<size_t>(err_len - 1));
  std::memcpy(err, message.data(), n);
  err[n] = '\0';
}

int32_t report(const ErrorInfo& error, char* err, int32_t err_len) {
  write_error(error.message, err, err_len);
  return static_cast<int32_t>(error.code);
}

void bind_view(const rtp_llm::StepBatch& b, RtpStepBatch* v) {
#define RTP_LLM_BIND(type, name, ...) v->name = b.name.data();
  RTP_LLM_STEP_ARRAYS(RTP_LLM_BIND)
  RTP_LLM_ALL_SAMPLING(RTP_LLM_BIND)
#undef RTP_LLM_BIND
}

constexpr double kNone = 0.0;

// Field descriptions, expanded from the same lists as the structs.
#define RTP_LLM_INFO(st, type, name, length, group, def, lo, lo_open, hi) \
  {#name, RTP_LLM_TYPE_##type, length, group, lo_open, static_cast<int64_t>(offsetof(st, name)), def, lo, hi},
#define RTP_LLM_CONFIG_INFO(type, name, def, min) \
  RTP_LLM_INFO(RtpEngineConfig, type, name, RTP_LLM_LEN_SCALAR, RTP_LLM_GROUP_NONE, def, min, 0, HUGE_VAL)
#define RTP_LLM_STATS_INFO(type, name, source) \
  RTP_LLM_INFO(RtpEngineStats, type, name, RTP_LLM_LEN_SCALAR, RTP_LLM_GROUP_NONE, kNone, kNone, 0, kNone)
#define RTP_LLM_COUNT_INFO(name) \
  RTP_LLM_INFO(RtpStepBatch, i32, name, RTP_LLM_LEN_SCALAR, RTP_LLM_GROUP_NONE, kNone, kNone, 0, kNone)
#define RTP_LLM_ARRAY_INFO(type, name, length, group) \
  RTP_LLM_INFO(RtpStepBatch, type, name, RTP_LLM_LEN_##length, RTP_LLM_GROUP_##group, kNone, kNone, 0, kNone)
#define RTP_LLM_PARAM_INFO(type, name, def, lo, lo_open, hi) \
  RTP_LLM_INFO(RtpStepBatch, type, name, RTP_LLM_LEN_S, RTP_LLM_GROUP_PARAM, static_cast<double>(def), lo, lo_open, hi)

const RtpFieldInfo kConfigFields[] = {
    RTP_LLM_ENGINE_CONFIG(RTP_LLM_CONFIG_INFO)
    RTP_LLM_INFO(RtpEngineConfig, i32, eos_token_ids, RTP_LLM_LEN_EOS, RTP_LLM_GROUP_NONE, kNone, kNone, 0, kNone)
    RTP_LLM_INFO(RtpEngineConfig, i32, num_eos_token_ids, RTP_LLM_LEN_SCALAR, RTP_LLM_GROUP_NONE, kNone, kNone, 0,
                 HUGE_VAL)};
const RtpFieldInfo kBatchFields[] = {RTP_LLM_STEP_COUNTS(RTP_LLM_COUNT_INFO) RTP_LLM_STEP_ARRAYS(RTP_LLM_ARRAY_INFO)
                                         RTP_LLM_ALL_SAMPLING(RTP_LLM_PARAM_INFO)};
const RtpFieldInfo kStatsFields[] = {RTP_LLM_ENGINE_STATS(RTP_LLM_STATS_INFO)};

template <size_t N>
constexpr RtpStructInfo describe(int64_t size, const RtpFieldInfo (&fields)[N]) {
  return {size, static_cast<int32_t>(N), fields};
}
const RtpStructInfo kConfigInfo = describe(sizeof(RtpEngineConfig), kConfigFields);
const RtpStructInfo kBatchInfo = describe(sizeof(RtpStepBatch), kBatchFields);
const RtpStructInfo kStatsInfo = describe(sizeof(RtpEngineStats), kStatsFields);

}  // namespace

extern "C" {

const RtpStructInfo* rtp_llm_struct_info(const char* name) {
  if (name == nullptr) return nullptr;
  if (std::strcmp(name, "RtpEngineConfig") == 0) return &kConfigInfo;
  if (std::strcmp(name, "RtpStepBatch") == 0) return &kBatchInfo;
  if (std::strcmp(name, "RtpEngineStats") == 0) return &kStatsInfo;
  return nullptr;
}

int64_t rtp_llm_engine_array_capacity(RtpEngine* engine, int32_t length) {
  using rtp_llm::ArrayLength;
  ArrayLength kind;
  switch (length) {
    case RTP_LLM_LEN_S: kind = ArrayLength::S; break;
    case RTP_LLM_LEN_S1: kind = ArrayLength::S1; break;
    case RTP_LLM_LEN_T: kind = ArrayLength::T; break;
    case RTP_LLM_LEN_SB: kind = ArrayLength::SB; break;
    case RTP_LLM_LEN_H: kind = ArrayLength::H; break;
    case RTP_LLM_LEN_L: kind = ArrayLength::L; break;
    default: return -1;
  }
  return static_cast<int64_t>(rtp_llm::array_capacity(kind, engine->engine->capacity()));
}

RtpEngine* rtp_llm_engine_create(const RtpEngineConfig* config, char* err, int32_t err_len) {
  if (config == nullptr) {
    write_error("config is NULL", err, err_len);
    return nullptr;
  }
  rtp_llm::EngineCoreConfig c;
#define RTP_LLM_COPY(type, name, ...) c.name = config->name;
  RTP_LLM_ENGINE_CONFIG(RTP_LLM_COPY)
#undef RTP_LLM_COPY
  if (config->num_eos_token_ids > 0 && config->eos_token_ids != nullptr) {
    c.eos_token_ids.assign(config->eos_token_ids, config->eos_token_ids + config->num_eos_token_ids);
  }
  ErrorInfo bad = c.validate();
  if (!bad.ok()) {
    write_error(bad.message, err, err_len);
    return nullptr;
  }
  auto* handle = new RtpEngine;
  handle->engine = std::make_unique<rtp_llm::EngineCore>(std::move(c));
  return handle;
}

void rtp_llm_engine_destroy(RtpEngine* engine) {
  if (engine == nullptr) return;
  engine->server.reset();  // calls in progress reference the engine
  delete engine;
}

int32_t rtp_llm_engine_enqueue(RtpEngine* engine, const void* generate_input_pb, int32_t len, int64_t* stream_id,
                               char* err, int32_t err_len, char* field, int32_t field_len) {
  GenerateInputPB input;
  ErrorInfo error;
  if (len < 0 || !input.ParseFromArray(generate_input_pb, len)) {
    error = {ErrorCode::INVALID_PARAMS, "cannot parse GenerateInputPB"};
  } else {
    std::vector<int32_t> prompt(input.token_ids().begin(), input.token_ids().end());
    rtp_llm::GenerateConfig config = rtp_llm::from_proto(input.generate_config(), engine->engine->config().max_seq_len);
    error = engine->engine->enqueue(std::move(prompt), std::move(config), stream_id);
  }
  write_error(error.field, field, field_len);
  return report(error, err, err_len);
}

namespace {
const RtpStepBatch* view_of(RtpEngine* engine, const rtp_llm::StepBatch& b) {
  RtpStepBatch* v = engine->views;
  // The engine's buffers never move: each gets its view once, found by address after that.
  while (v->stream_ids != nullptr && v->stream_ids != b.stream_ids.data()) ++v;
  if (v->stream_ids == nullptr) bind_view(b, v);
#define RTP_LLM_COUNT(name) v->name = b.name;
  RTP_LLM_STEP_COUNTS(RTP_LLM_COUNT)
#undef RTP_LLM_COUNT
  return v;
}
}  // namespace

const RtpStepBatch* rtp_llm_engine_schedule(RtpEngine* engine) {
  return view_of(engine, engine->engine->schedule());
}

const RtpStepBatch* rtp_llm_engine_schedule_ahead(RtpEngine* engine) {
  return view_of(engine, engine->engine->schedule_ahead());
}

int32_t rtp_llm_engine_commit(RtpEngine* engine, const int32_t* tokens, const float* logprobs, int32_t n,
                              const int32_t* top_ids, const float* top_logprobs, int32_t top_k,
                              const float* prompt_logprobs, int32_t num_prompt, const int32_t* prompt_top_ids,
                              const float* prompt_top_logprobs, int32_t prompt_top_k, int32_t* appended, char* err,
                              int32_t err_len) {
  const rtp_llm::StepSamples samples{tokens,          logprobs,       top_ids,     top_logprobs,
                                     top_k,           prompt_logprobs, prompt_top_ids, prompt_top_logprobs,
                                     prompt_top_k,    num_prompt};
  return report(engine->engine->commit(samples, n, appended), err, err_len);
}

int32_t rtp_llm_engine_next_grammar(RtpEngine* engine, int64_t* stream_id, char* field, int32_t field_len, char* spec,
                                    int32_t spec_cap) {
  if (engine->held_grammars.empty()) {
    RtpEngine::Grammar g;
    if (!engine->engine->next_grammar(&g.id, &g.field, &g.spec)) return -1;
    engine->held_grammars.push_back(std::move(g));
  }
  const RtpEngine::Grammar& g = engine->held_grammars.front();
  const int32_t len = static_cast<int32_t>(g.spec.size());
  if (len > spec_cap || spec == nullptr) return len;
  *stream_id = g.id;
  write_error(g.field, field, field_len);
  std::memcpy(spec, g.spec.data(), g.spec.size());
  engine->held_grammars.pop_front();
  return len;
}

void rtp_llm_engine_grammar_done(RtpEngine* engine, int64_t stream_id, int32_t error_code, const char* message,
                                 const char* field, int64_t compile_us, int32_t cache_hit) {
  const ErrorInfo error = error_code == 0 ? ErrorInfo{}
                                          : ErrorInfo{static_cast<ErrorCode>(error_code), message ? message : "",
                                                      field ? field : ""};
  engine->engine->grammar_done(stream_id, error, compile_us, cache_hit != 0);
}

int32_t rtp_llm_engine_take_ended_grammars(RtpEngine* engine, int64_t* ids, int32_t cap) {
  std::vector<int64_t>& ended = engine->ended_grammars;
  if (ended.empty()) engine->engine->take_ended_grammars(&ended);
  const int32_t n = std::min(cap, static_cast<int32_t>(ended.size()));
  std::copy(ended.begin(), ended.begin() + n, ids);
  ended.erase(ended.begin(), ended.begin() + n);
  return n;
}

int32_t rtp_llm_engine_fail_batch(RtpEngine* engine, const char* message, char* err, int32_t err_len) {
  return report(engine->engine->fail_batch(message == nullptr ? "model execution failed" : message), err, err_len);
}

int32_t rtp_llm_engine_wait_for_work(RtpEngine* engine, int32_t timeout_ms) {
  return engine->engine->wait_for_work(timeout_ms) ? 1 : 0;
}

void rtp_llm_engine_stop(RtpEngine* engine) { engine->engine->stop(); }

int32_t rtp_llm_engine_abort(RtpEngine* engine, int64_t stream_id) { return engine->engine->abort(stream_id) ? 1 : 0; }

int32_t rtp_llm_engine_poll(RtpEngine* engine, int64_t stream_id, int32_t from, void* out, int32_t cap,
                            int32_t* error_code) {
  rtp_llm::StreamUpdate update;
  if (!engine->engine->poll(stream_id, from, &update)) return -1;
  if (error_code != nullptr) *error_code = static_cast<int32_t>(update.error.code);
  GenerateOutputsPB message;
  rtp_llm::to_proto(stream_id, update, rtp_llm::EngineCore::now_us(), &message);
  if (!update.error.ok()) {
    message.mutable_error_info()->set_error_code(update.error.code == ErrorCode::CANCELLED ? ::CANCELLED
                                                                                          : ::UNKNOWN_ERROR);
    message.mutable_error_info()->set_error_message(update.error.message);
    message.mutable_error_info()->set_field(update.error.field);
  }
  const size_t size = message.ByteSizeLong();
  if (size <= static_cast<size_t>(cap) && out != nullptr) message.SerializeToArray(out, static_cast<int>(size));
  return static_cast<int32_t>(size);
}

int32_t rtp_llm_engine_stream_tokens(RtpEngine* engine, int64_t stream_id, int32_t* out, int32_t cap,
                                     int32_t* prompt_len) {
  std::vector<int32_t> tokens;
  int prompt = 0;
  if (!engine->engine->tokens(stream_id, &tokens, &prompt)) return -1;
  if (prompt_len != nullptr) *prompt_len = prompt;
  if (out != nullptr && tokens.size() <= static_cast<size_t>(std::max(cap, 0))) {
    std::copy(tokens.begin(), tokens.end(), out);
  }
  return static_cast<int32_t>(tokens.size());
}

void rtp_llm_engine_release(RtpEngine* engine, int64_t stream_id) { engine->engine->release(stream_id); }

void rtp_llm_engine_stats(RtpEngine* engine, RtpEngineStats* out) {
  const rtp_llm::EngineStats s = engine->engine->stats();
#define RTP_LLM_STAT(type, name, source) out->name = s.source;
  RTP_LLM_ENGINE_STATS(RTP_LLM_STAT)
#undef RTP_LLM_STAT
}

void rtp_llm_engine_set_kv_source(RtpEngine* engine, const char* source, int32_t len) {
  engine->engine->set_kv_source(std::string(source == nullptr ? "" : source, source == nullptr ? 0 : std::max(len, 0)));
}

void rtp_llm_engine_release_export(RtpEngine* engine, int64_t id) { engine->engine->release_export(id); }

int64_t rtp_llm_engine_next_kv_import(RtpEngine* engine, int32_t timeout_ms, int32_t* remote, int32_t* local,
                                      int32_t cap, int32_t* num_blocks, char* source, int32_t source_cap,
                                      int32_t* source_len, int64_t* waited_us) {
  rtp_llm::KvImportJob job;
  if (!engine->engine->next_kv_import(timeout_ms, &job)) return -1;
  *waited_us = job.waited_us;
  *source_len = static_cast<int32_t>(job.source.size());
  *num_blocks = static_cast<int32_t>(job.remote.size());
  if (job.source.size() > static_cast<size_t>(std::max(source_cap, 0)) ||
      job.remote.size() > static_cast<size_t>(std::max(cap, 0))) {
    engine->engine->kv_import_done(job.stream_id, false);  // unread blocks are never published
    return -2;
  }
  std::copy(job.source.begin(), job.source.end(), source);
  std::copy(job.remote.begin(), job.remote.end(), remote);
  std::copy(job.local.begin(), job.local.end(), local);
  return job.stream_id;
}

void rtp_llm_engine_kv_import_done(RtpEngine* engine, int64_t stream_id, int32_t ok, int64_t bytes, int64_t us) {
  engine->engine->kv_import_done(stream_id, ok != 0, bytes, us);
}

int32_t rtp_llm_engine_start_rpc_server(RtpEngine* engine, const char* address, char* err, int32_t err_len) {
  if (engine->server) {
    write_error("the RPC server is already running", err, err_len);
    return -1;
  }
  auto server = std::make_unique<rtp_llm::RpcServer>(*engine->engine);
  std::string error;
  const int port = server->start(address == nullptr ? "" : address, &error);
  if (port < 0) {
    write_error(error, err, err_len);
    return -1;
  }
  engine->server = std::move(server);
  return port;
}

void rtp_llm_engine_stop_rpc_server(RtpEngine* engine) { engine->server.reset(); }

RtpFillWorker* rtp_llm_fill_worker_create(void) { return new RtpFillWorker(); }

void rtp_llm_fill_worker_destroy(RtpFillWorker* worker) { delete worker; }

int32_t rtp_llm_fill_worker_submit(RtpFillWorker* worker, const RtpFillCallSpec* specs, int32_t num_calls,
                                   int64_t* gate, int64_t ticket) {
  static_assert(sizeof(RtpFillCallSpec) == sizeof(rtp_llm::FillWorker::Spec), "one layout");
  const auto* s = reinterpret_cast<const rtp_llm::FillWorker::Spec*>(specs);
  return worker->worker.submit(s, num_calls, gate, ticket) ? 0 : -1;
}

int rtp_llm_fill_call_c_function(void* func, void* args, int32_t num_args, void* result) {
  return rtp_llm::call_c_function(func, args, num_args, result);
}

int32_t rtp_llm_fill_worker_wait(RtpFillWorker* worker, int32_t* failed_at) { return worker->worker.wait(failed_at); }

}  // extern "C"
