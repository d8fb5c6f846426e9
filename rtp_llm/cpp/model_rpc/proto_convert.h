// Conversions between the model_rpc protocol (upstream's messages) and the engine's types.
#pragma once

#include <cstdint>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "rtp_llm/cpp/engine/engine_core.h"
#include "rtp_llm/cpp/model_rpc/proto/model_rpc_service.pb.h"

namespace rtp_llm {

// Call metadata of GenerateStreamCall and GenerateMultiplexed: refuse a request
// (RESOURCE_EXHAUSTED) when this many streams already wait in the engine's queue. The
// frontend's --max_queue_size rides along this way, so the cap is checked where the queue is
// (atomically with the admission) without a backend flag of its own.
inline constexpr char kMaxWaitingKey[] = "rtp-max-waiting";
int max_waiting(const grpc::CallbackServerContext& context);  // 0: no cap

// GenerateConfigPB -> GenerateConfig. proto3 cannot tell "unset" from 0, so 0 means the
// default where 0 is not a valid value (max_new_tokens: up to max_seq_len; a sampling
// parameter whose range excludes 0, e.g. top_p and repetition_penalty: 1). temperature 0
// means greedy.
GenerateConfig from_proto(const GenerateConfigPB& pb, int max_seq_len);

// One GenerateOutputsPB carrying `update.new_tokens` (the tokens not sent before) and the
// stream's aux info; `finished` when the stream ended.
void to_proto(int64_t request_id, const StreamUpdate& update, int64_t now_us, GenerateOutputsPB* out);

// What a reader of a stream sends after a poll: nothing yet, an update with the new tokens
// (streaming requests only), or the last update (the stream ended or failed).
enum class Send { kNothing, kUpdate, kLast };
Send what_to_send(const StreamUpdate& update, bool streaming);

// Admits a GenerateInputPB's request (its prompt, and its config through from_proto).
ErrorInfo enqueue_input(EngineCore& engine, const GenerateInputPB& input, int max_waiting, int64_t* id);

// A request's error as gRPC sends it: the status code (upstream's mapping: LONG_PROMPT ->
// OUT_OF_RANGE, malloc -> RESOURCE_EXHAUSTED, timeout -> DEADLINE_EXCEEDED...) and the
// ErrorDetailsPB; to_status puts both in a gRPC status (the details serialized).
grpc::StatusCode status_code(const ErrorInfo& error);
ErrorDetailsPB error_details(const ErrorInfo& error);
grpc::Status to_status(const ErrorInfo& error);

void fill_worker_status(const EngineStats& stats, const EngineCoreConfig& config, WorkerStatusPB* out);
void fill_cache_status(const EngineStats& stats, CacheStatusPB* out);

}  // namespace rtp_llm
