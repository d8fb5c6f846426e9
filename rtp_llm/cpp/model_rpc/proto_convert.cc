#include "rtp_llm/cpp/model_rpc/proto_convert.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace rtp_llm {

namespace {
// proto3 cannot tell unset from 0: a 0 outside the parameter's range means its default.
template <class T>
T or_default(T value, double lo, bool lo_open, T def) {
  const bool zero_valid = lo_open ? 0.0 > lo : 0.0 >= lo;
  return value == T{} && !zero_valid ? def : value;
}
}  // namespace

GenerateConfig from_proto(const GenerateConfigPB& pb, int max_seq_len) {
  GenerateConfig c;
  c.max_new_tokens = pb.max_new_tokens() != 0 ? pb.max_new_tokens() : max_seq_len;
  c.min_new_tokens = pb.min_new_tokens();
  c.ignore_eos = pb.ignore_eos();
  c.timeout_ms = pb.timeout_ms();
  for (const IntVector& row : pb.stop_words_list().rows()) {
    c.stop_words_list.emplace_back(row.values().begin(), row.values().end());
  }
#define RTP_LLM_FROM_PROTO(type, name, def, lo, lo_open, hi) c.name = or_default(pb.name(), lo, lo_open, c.name);
  RTP_LLM_SAMPLING_PARAMS(RTP_LLM_FROM_PROTO)
#undef RTP_LLM_FROM_PROTO
  c.random_seed = pb.has_random_seed() ? pb.random_seed().value() : -1;
  c.return_logprobs = pb.return_softmax_probs() || pb.return_cum_log_probs();
  // The first grammar field set is the stream's; validate() refuses a second.
#define RTP_LLM_FROM_PROTO_GRAMMAR(name)    \
  if (!pb.has_##name()) {                  \
  } else if (c.grammar.empty()) {          \
    c.grammar.field = #name;               \
    c.grammar.spec = pb.name().value();    \
  } else if (c.grammar.conflict.empty()) { \
    c.grammar.conflict = #name;            \
  }
  RTP_LLM_GRAMMAR_FIELDS(RTP_LLM_FROM_PROTO_GRAMMAR)
#undef RTP_LLM_FROM_PROTO_GRAMMAR
  c.no_repeat_ngram_size = pb.has_no_repeat_ngram_size() ? pb.no_repeat_ngram_size().value() : 0;
  c.prompt_logprobs = pb.has_prompt_logprobs() ? pb.prompt_logprobs().value() : -1;
  c.logit_bias.assign(pb.logit_bias().begin(), pb.logit_bias().end());
  std::sort(c.logit_bias.begin(), c.logit_bias.end());  // a map's order is unspecified: make rows reproducible
  c.in_think_mode = pb.in_think_mode();
  c.max_thinking_tokens = pb.max_thinking_tokens();
  c.end_think_token_ids.assign(pb.end_think_token_ids().begin(), pb.end_think_token_ids().end());
  c.force_disable_sp_run = pb.force_disable_sp_run();
  c.can_use_pd_separation = pb.can_use_pd_separation();
  return c;
}

namespace {

// `values` as a TensorPB of `shape` (default: 1-D).
void set_fp32(TensorPB* t, const std::vector<float>& values, std::vector<int64_t> shape = {}) {
  t->set_data_type(TensorPB::FP32);
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  for (int64_t d : shape) t->add_shape(d);
  t->set_fp32_data(values.data(), values.size() * sizeof(float));
}

void set_int32(TensorPB* t, const std::vector<int32_t>& values, const std::vector<int64_t>& shape) {
  t->set_data_type(TensorPB::INT32);
  for (int64_t d : shape) t->add_shape(d);
  t->set_int32_data(values.data(), values.size() * sizeof(int32_t));
}

int32_t us(int64_t from, int64_t to) { return from > 0 && to >= from ? static_cast<int32_t>(to - from) : 0; }

}  // namespace

void to_proto(int64_t request_id, const StreamUpdate& u, int64_t now_us, GenerateOutputsPB* out) {
  out->Clear();
  out->set_request_id(request_id);
  FlattenOutputPB* flat = out->mutable_flatten_output();
  flat->add_finished(u.done());

  const auto n = static_cast<int64_t>(u.new_tokens.size());
  set_int32(flat->mutable_output_ids(), u.new_tokens, {1, n});

  AuxInfoPB* aux = flat->add_aux_info();
  const StreamTiming& t = u.timing;
  aux->set_cost_time_us(us(t.enqueue_us, t.finish_us > 0 ? t.finish_us : now_us));
  aux->set_first_token_cost_time_us(us(t.enqueue_us, t.first_token_us));
  aux->set_wait_time_us(us(t.enqueue_us, t.first_scheduled_us));
  aux->set_iter_count(t.iter_count);
  aux->set_input_len(u.prompt_len);
  aux->set_output_len(u.num_generated);
  aux->set_step_output_len(static_cast<int32_t>(u.new_tokens.size()));
  aux->set_total_reuse_len(t.reuse_len);
  aux->set_local_reuse_len(t.reuse_len);
  aux->set_prefix_len(t.reuse_len);
  aux->set_finish_reason(u.finish_reason);
  aux->set_speculative_draft_rounds(u.spec.draft_rounds);
  for (int32_t n : u.spec.accepted_per_pos) aux->add_speculative_accepted_tokens_per_pos(n);
  if (!u.new_logprobs.empty()) set_fp32(aux->mutable_logprobs(), u.new_logprobs);
  if (u.top_logprobs > 0 && n > 0) {
    set_int32(aux->mutable_top_token_ids(), u.new_top_ids, {n, u.top_logprobs});
    set_fp32(aux->mutable_top_logprobs(), u.new_top_logprobs, {n, u.top_logprobs});
  }
  const auto np = static_cast<int64_t>(u.prompt_logprobs.size());
  if (np > 0) set_fp32(aux->mutable_prompt_logprobs(), u.prompt_logprobs);
  if (u.prompt_top_logprobs > 0 && np > 0) {
    set_int32(aux->mutable_prompt_top_token_ids(), u.prompt_top_ids, {np, u.prompt_top_logprobs});
    set_fp32(aux->mutable_prompt_top_logprobs(), u.prompt_top_lps, {np, u.prompt_top_logprobs});
  }
  if (u.kv_exported) {
    aux->set_pd_sep(true);
    KvExportPB* ex = aux->mutable_kv_export();
    ex->set_export_id(u.kv_export_id);
    for (int32_t b : u.kv_export_blocks) ex->add_block_ids(b);
    ex->set_block_size(u.block_size);
    ex->set_source(u.kv_source);
  }
}

int max_waiting(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kMaxWaitingKey);
  if (it == metadata.end()) return 0;
  try {
    return std::max(0, std::stoi(std::string(it->second.data(), it->second.size())));
  } catch (const std::exception&) {
    return 0;
  }
}

Send what_to_send(const StreamUpdate& update, bool streaming) {
  if (!update.error.ok() || update.done()) return Send::kLast;
  return streaming && !update.new_tokens.empty() ? Send::kUpdate : Send::kNothing;
}

ErrorInfo enqueue_input(EngineCore& engine, const GenerateInputPB& input, int max_waiting, int64_t* id) {
  std::vector<int32_t> prompt(input.token_ids().begin(), input.token_ids().end());
  GenerateConfig config = from_proto(input.generate_config(), engine.config().max_seq_len);
  if (input.generated_token_ids().empty() && !input.has_kv_export()) {
    return engine.enqueue(std::move(prompt), std::move(config), id, max_waiting);
  }
  KvHandover handover;
  handover.generated.assign(input.generated_token_ids().begin(), input.generated_token_ids().end());
  handover.blocks.assign(input.kv_export().block_ids().begin(), input.kv_export().block_ids().end());
  handover.block_size = input.kv_export().block_size();
  handover.source = input.kv_export().source();
  return engine.enqueue(std::move(prompt), std::move(config), id, max_waiting, &handover);
}

grpc::StatusCode status_code(const ErrorInfo& error) {
  switch (error.code) {
    case ErrorCode::NONE_ERROR: return grpc::StatusCode::OK;
    case ErrorCode::CANCELLED: return grpc::StatusCode::CANCELLED;
    case ErrorCode::MALLOC_FAILED: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case ErrorCode::CONCURRENCY_LIMIT_ERROR: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case ErrorCode::GENERATE_TIMEOUT: return grpc::StatusCode::DEADLINE_EXCEEDED;
    case ErrorCode::LONG_PROMPT_ERROR:
    case ErrorCode::EXCEEDS_KV_CACHE_MAX_LEN: return grpc::StatusCode::OUT_OF_RANGE;
    case ErrorCode::INVALID_PARAMS: return grpc::StatusCode::INVALID_ARGUMENT;
    case ErrorCode::EXECUTION_EXCEPTION: return grpc::StatusCode::INTERNAL;
    default: return grpc::StatusCode::INTERNAL;
  }
}

ErrorDetailsPB error_details(const ErrorInfo& error) {
  ErrorDetailsPB details;
  details.set_error_code(static_cast<int64_t>(error.code));
  details.set_error_message(error.message);
  details.set_field(error.field);
  return details;
}

grpc::Status to_status(const ErrorInfo& error) {
  if (error.ok()) return grpc::Status::OK;
  return grpc::Status(status_code(error), error.message, error_details(error).SerializeAsString());
}

void fill_worker_status(const EngineStats& s, const EngineCoreConfig& config, WorkerStatusPB* out) {
  out->set_role("PDFUSION");
  out->set_alive(true);
  out->set_running_query_len(s.running);
  out->set_waiting_query_len(s.waiting);
  out->set_iterate_count(static_cast<int32_t>(s.steps));
  out->set_dp_size(1);
  out->set_tp_size(1);
  out->set_available_kv_cache(int64_t{s.kv.free_blocks + s.kv.cached_blocks} * s.kv.block_size);
  out->set_total_kv_cache(int64_t{s.kv.total_blocks} * s.kv.block_size);
  out->set_max_seq_len(config.max_seq_len);
  out->set_max_batch_tokens_size(config.max_num_batched_tokens);
  out->set_generated_tokens(s.generated_tokens);
  out->set_grammar_requests(s.grammar.requests);
  out->set_grammar_cache_hits(s.grammar.cache_hits);
  out->set_grammar_compiles(s.grammar.compiles);
  out->set_grammar_compile_us(s.grammar.compile_us);
  out->set_grammar_failures(s.grammar.failures);
  out->set_spec_draft_rounds(s.spec.draft_rounds);
  out->set_spec_draft_tokens(s.spec.draft_tokens);
  out->set_spec_accepted_tokens(s.spec.accepted_tokens);
  out->set_kv_exports(s.kv_exports);
  out->set_kv_exported_blocks(s.kv_transfer.exported_blocks);
  out->set_kv_imported_blocks(s.kv_transfer.imported_blocks);
  out->set_kv_import_bytes(s.kv_transfer.import_bytes);
  out->set_kv_import_us(s.kv_transfer.import_us);
  out->set_kv_imports(s.kv_transfer.imports);
  out->set_kv_import_failures(s.kv_transfer.failures);
  const auto& t = s.kv_transfer;
  out->mutable_kv_read_seconds_bounds()->Assign(kKvReadSecondsBounds.begin(), kKvReadSecondsBounds.end());
  out->mutable_kv_read_seconds_counts()->Assign(t.read_seconds.counts.begin(), t.read_seconds.counts.end());
  out->mutable_kv_read_bytes_bounds()->Assign(kKvReadBytesBounds.begin(), kKvReadBytesBounds.end());
  out->mutable_kv_read_bytes_counts()->Assign(t.read_bytes.counts.begin(), t.read_bytes.counts.end());
}

void fill_cache_status(const EngineStats& s, CacheStatusPB* out) {
  out->set_available_kv_cache(int64_t{s.kv.free_blocks + s.kv.cached_blocks} * s.kv.block_size);
  out->set_total_kv_cache(int64_t{s.kv.total_blocks} * s.kv.block_size);
  out->set_block_size(s.kv.block_size);
  out->set_hit_tokens(s.kv.hit_tokens);
  out->set_lookup_tokens(s.kv.lookup_tokens);
}

}  // namespace rtp_llm
