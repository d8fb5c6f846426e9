// FrontendStreamService: a frontend process's requests on one bidirectional call.
//
// The frontend sends MultiplexRequestPBs (start a request under its tag, or cancel one); the
// backend answers with MultiplexOutputsPBs, each carrying an update for every request that
// has something new. One write is in flight at a time: what streams produce while it is on
// the wire goes out together in the next one, so a step of N streams costs a few messages,
// not N, and a slow reader gets fewer, larger messages instead of a growing queue.
//
// Invariants: a tag's last update (finished, or with a status) is its last; after it, and
// after a cancel, the engine stream is released. When the call ends, every stream it still
// has is aborted and released.
#pragma once

#include <grpcpp/grpcpp.h>

#include "rtp_llm/cpp/engine/engine_core.h"
#include "rtp_llm/cpp/model_rpc/proto/model_rpc_service.grpc.pb.h"

namespace rtp_llm {

class MultiplexService final : public FrontendStreamService::CallbackService {
 public:
  explicit MultiplexService(EngineCore& engine) : engine_(engine) {}

  grpc::ServerBidiReactor<MultiplexRequestPB, MultiplexOutputsPB>* GenerateMultiplexed(
      grpc::CallbackServerContext* context) override;

 private:
  EngineCore& engine_;
};

}  // namespace rtp_llm
