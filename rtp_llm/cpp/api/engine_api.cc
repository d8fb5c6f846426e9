#include "rtp_llm/cpp/api/engine_api.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "rtp_llm/cpp/engine/engine.h"
#include "rtp_llm/cpp/model_rpc/proto_convert.h"
#include "rtp_llm/cpp/model_rpc/rpc_server.h"

struct RtpEngine {
  std::unique_ptr<rtp_llm::Engine> engine;
  std::unique_ptr<rtp_llm::RpcServer> server;
  // One view per batch buffer the engine has handed out (see Engine::schedule_ahead).
  RtpStepBatch views[4]{};
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
  v->stream_ids = b.stream_ids.data();
  v->query_lens = b.query_lens.data();
  v->prefix_lens = b.prefix_lens.data();
  v->context_lens = b.context_lens.data();
  v->query_starts = b.query_starts.data();
  v->do_sample = b.do_sample.data();
  v->block_tables = b.block_tables.data();
  v->token_ids = b.token_ids.data();
  v->positions = b.positions.data();
  v->slot_mapping = b.slot_mapping.data();
  v->temperature = b.temperature.data();
  v->top_k = b.top_k.data();
  v->top_p = b.top_p.data();
  v->min_p = b.min_p.data();
  v->repetition_penalty = b.repetition_penalty.data();
  v->presence_penalty = b.presence_penalty.data();
  v->frequency_penalty = b.frequency_penalty.data();
  v->random_seed = b.random_seed.data();
  v->num_generated = b.num_generated.data();
  v->return_logprobs = b.return_logprobs.data();
}

}  // namespace

extern "C" {

RtpEngine* rtp_llm_engine_create(const RtpEngineConfig* config, char* err, int32_t err_len) {
  if (config == nullptr) {
    write_error("config is NULL", err, err_len);
    return nullptr;
  }
  rtp_llm::EngineConfig c;
  c.num_blocks = config->num_blocks;
  c.block_size = config->block_size;
  c.max_batch_size = config->max_batch_size;
  c.max_num_batched_tokens = config->max_num_batched_tokens;
  c.max_seq_len = config->max_seq_len;
  c.enable_prefix_cache = config->enable_prefix_cache != 0;
  if (config->num_eos_token_ids > 0 && config->eos_token_ids != nullptr) {
    c.eos_token_ids.assign(config->eos_token_ids, config->eos_token_ids + config->num_eos_token_ids);
  }
  ErrorInfo bad = c.validate();
  if (!bad.ok()) {
    write_error(bad.message, err, err_len);
    return nullptr;
  }
  auto* handle = new RtpEngine;
  handle->engine = std::make_unique<rtp_llm::Engine>(std::move(c));
  return handle;
}

void rtp_llm_engine_destroy(RtpEngine* engine) {
  if (engine == nullptr) return;
  engine->server.reset();  // calls in progress reference the engine
  delete engine;
}

int32_t rtp_llm_engine_enqueue(RtpEngine* engine, const void* generate_input_pb, int32_t len, int64_t* stream_id,
                               char* err, int32_t err_len) {
  GenerateInputPB input;
  if (len < 0 || !input.ParseFromArray(generate_input_pb, len)) {
    return report({ErrorCode::INVALID_PARAMS, "cannot parse GenerateInputPB"}, err, err_len);
  }
  std::vector<int32_t> prompt(input.token_ids().begin(), input.token_ids().end());
  rtp_llm::GenerateConfig config = rtp_llm::from_proto(input.generate_config(), engine->engine->config().max_seq_len);
  return report(engine->engine->enqueue(std::move(prompt), std::move(config), stream_id), err, err_len);
}

namespace {
const RtpStepBatch* view_of(RtpEngine* engine, const rtp_llm::StepBatch& b) {
  RtpStepBatch* v = engine->views;
  // The engine's buffers never move: each gets its view once, found by address after that.
  while (v->stream_ids != nullptr && v->stream_ids != b.stream_ids.data()) ++v;
  if (v->stream_ids == nullptr) bind_view(b, v);
  v->num_streams = b.num_streams;
  v->num_tokens = b.num_tokens;
  v->num_sampled = b.num_sampled;
  v->block_table_stride = b.block_table_stride;
  v->num_prefill = b.num_prefill;
  return v;
}
}  // namespace

const RtpStepBatch* rtp_llm_engine_schedule(RtpEngine* engine) {
  return view_of(engine, engine->engine->schedule());
}

const RtpStepBatch* rtp_llm_engine_schedule_ahead(RtpEngine* engine) {
  return view_of(engine, engine->engine->schedule_ahead());
}

int32_t rtp_llm_engine_commit(RtpEngine* engine, const int32_t* tokens, const float* logprobs, int32_t n, char* err,
                              int32_t err_len) {
  return report(engine->engine->commit(tokens, logprobs, n), err, err_len);
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
  rtp_llm::to_proto(stream_id, update, rtp_llm::Engine::now_us(), &message);
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
  *out = {s.running,       s.waiting,        s.tracked_streams, s.kv.total_blocks, s.kv.free_blocks,
          s.kv.cached_blocks, s.kv.used_blocks, s.kv.block_size,  s.kv.hit_tokens,   s.kv.lookup_tokens,
          s.steps,         s.preemptions,    s.finished};
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

}  // extern "C"
