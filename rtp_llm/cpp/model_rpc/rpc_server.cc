#include "rtp_llm/cpp/model_rpc/rpc_server.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <utility>

#include "rtp_llm/cpp/model_rpc/proto_convert.h"

namespace rtp_llm {

namespace {

// One GenerateStreamCall. Owns itself through self_ until OnDone; the engine's listener
// holds only a weak reference, so a late notification after OnDone is a no-op. mu_ is
// recursive because gRPC may run a reaction inline from StartWrite/Finish.
class GenerateCall final : public grpc::ServerWriteReactor<GenerateOutputsPB>,
                           public std::enable_shared_from_this<GenerateCall> {
 public:
  explicit GenerateCall(EngineCore& engine) : engine_(engine) {}

  // max_waiting: the caller's cap on the engine's waiting queue (0: none).
  void start(const GenerateInputPB& input, int max_waiting) {
    self_ = shared_from_this();
    request_id_ = input.request_id();
    streaming_ = input.generate_config().is_streaming();
    ErrorInfo error = enqueue_input(engine_, input, max_waiting, &stream_id_);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (!error.ok()) {
      finishing_ = true;
      Finish(to_status(error));
      return;
    }
    enqueued_ = true;
    std::weak_ptr<GenerateCall> weak = self_;
    engine_.set_listener(stream_id_, [weak] {
      if (auto call = weak.lock()) call->pump();
    });
  }

  // Sends what the stream has that the client has not seen, unless a write is pending.
  void pump() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (writing_ || finishing_) return;
    if (!engine_.poll(stream_id_, sent_, &update_)) {
      finish(grpc::Status(grpc::StatusCode::INTERNAL, "stream vanished"));
      return;
    }
    const Send send = what_to_send(update_, streaming_);
    if (send == Send::kNothing) return;
    if (!update_.error.ok()) {
      finish(to_status(update_.error));
      return;
    }
    to_proto(request_id_, update_, EngineCore::now_us(), &message_);
    sent_ = update_.num_generated;
    if (send == Send::kLast) {
      finishing_ = true;
      StartWriteAndFinish(&message_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      writing_ = true;
      StartWrite(&message_);
    }
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    writing_ = false;
    if (!ok) {  // the client is gone
      engine_.abort(stream_id_);
      finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    pump();
  }

  void OnCancel() override {
    if (enqueued_) engine_.abort(stream_id_);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (!writing_) finish(grpc::Status::CANCELLED);  // else OnWriteDone(false) finishes
  }

  void OnDone() override {
    if (enqueued_) engine_.release(stream_id_);
    std::shared_ptr<GenerateCall> last;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      last.swap(self_);
    }
    // `last` may be the final reference: *this is destroyed on return.
  }

 private:
  void finish(const grpc::Status& status) {
    if (finishing_) return;
    finishing_ = true;
    Finish(status);
  }

  EngineCore& engine_;
  std::recursive_mutex mu_;
  std::shared_ptr<GenerateCall> self_;
  int64_t request_id_ = 0;
  int64_t stream_id_ = 0;
  bool streaming_ = false;
  bool enqueued_ = false;
  bool writing_ = false;
  bool finishing_ = false;
  int sent_ = 0;  // generated tokens already sent
  StreamUpdate update_;
  GenerateOutputsPB message_;
};

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace

grpc::ServerWriteReactor<GenerateOutputsPB>* ModelRpcService::GenerateStreamCall(grpc::CallbackServerContext* context,
                                                                                 const GenerateInputPB* request) {
  auto call = std::make_shared<GenerateCall>(engine_);
  call->start(*request, max_waiting(*context));
  return call.get();  // kept alive by its own self_ until OnDone
}

grpc::ServerUnaryReactor* ModelRpcService::CheckHealth(grpc::CallbackServerContext* context, const EmptyPB*,
                                                       CheckHealthResponsePB* response) {
  response->set_health("ok");
  return Reply(context);
}

grpc::ServerUnaryReactor* ModelRpcService::RemoteFinish(grpc::CallbackServerContext* context,
                                                        const RemoteFinishRequestPB* request, EmptyPB*) {
  engine_.release_export(request->request_id());
  return Reply(context);
}

grpc::ServerUnaryReactor* ModelRpcService::GetWorkerStatus(grpc::CallbackServerContext* context,
                                                           const StatusVersionPB*, WorkerStatusPB* response) {
  fill_worker_status(engine_.stats(), engine_.config(), response);
  return Reply(context);
}

grpc::ServerUnaryReactor* ModelRpcService::GetCacheStatus(grpc::CallbackServerContext* context,
                                                          const CacheVersionPB*, CacheStatusPB* response) {
  fill_cache_status(engine_.stats(), response);
  return Reply(context);
}

int RpcServer::start(const std::string& address, std::string* error) {
  if (server_) {
    *error = "the RPC server is already running";
    return -1;
  }
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service_);
  builder.RegisterService(&multiplex_);
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    server_.reset();
    *error = "cannot listen on " + address + " (address in use or invalid?)";
    return -1;
  }
  return port;
}

void RpcServer::stop() {
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  server_->Wait();
  server_.reset();
}

}  // namespace rtp_llm
