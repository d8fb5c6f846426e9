// The backend's gRPC server over an EngineCore: upstream's RpcService, and the frontends'
// FrontendStreamService (multiplex_call.h). Callback API: no thread per call, so thousands of
// concurrent streams cost memory, not threads.
//
// GenerateStreamCall: streaming requests get one message per batch of new tokens (only the
// tokens not sent before); others get one final message. A client that cancels or
// disconnects aborts its engine stream, whose blocks are freed at once (or at the commit of
// the step it is in).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "rtp_llm/cpp/engine/engine_core.h"
#include "rtp_llm/cpp/model_rpc/multiplex_call.h"
#include "rtp_llm/cpp/model_rpc/proto/model_rpc_service.grpc.pb.h"

namespace rtp_llm {

class ModelRpcService final : public RpcService::CallbackService {
 public:
  explicit ModelRpcService(EngineCore& engine) : engine_(engine) {}

  grpc::ServerWriteReactor<GenerateOutputsPB>* GenerateStreamCall(grpc::CallbackServerContext* context,
                                                                  const GenerateInputPB* request) override;
  grpc::ServerUnaryReactor* CheckHealth(grpc::CallbackServerContext* context, const EmptyPB* request,
                                        CheckHealthResponsePB* response) override;
  grpc::ServerUnaryReactor* GetWorkerStatus(grpc::CallbackServerContext* context, const StatusVersionPB* request,
                                            WorkerStatusPB* response) override;
  grpc::ServerUnaryReactor* GetCacheStatus(grpc::CallbackServerContext* context, const CacheVersionPB* request,
                                           CacheStatusPB* response) override;
  // PREFILL: a decode instance read the KV blocks of export request_id (EngineCore::release_export).
  grpc::ServerUnaryReactor* RemoteFinish(grpc::CallbackServerContext* context, const RemoteFinishRequestPB* request,
                                         EmptyPB* response) override;

 private:
  EngineCore& engine_;
};

class RpcServer {
 public:
  explicit RpcServer(EngineCore& engine) : service_(engine), multiplex_(engine) {}
  ~RpcServer() { stop(); }

  // Listens on `address` ("host:port"; port 0 picks a free one). Returns the bound port, or
  // -1 with the reason in `error`.
  int start(const std::string& address, std::string* error);
  // Cancels calls in progress (their streams are aborted) and stops listening.
  void stop();

 private:
  ModelRpcService service_;   // upstream's RpcService
  MultiplexService multiplex_;  // the frontends' transport (multiplex_call.h)
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace rtp_llm
