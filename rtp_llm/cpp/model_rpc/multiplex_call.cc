#include "rtp_llm/cpp/model_rpc/multiplex_call.h"

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rtp_llm/cpp/model_rpc/proto_convert.h"

namespace rtp_llm {

namespace {

// One GenerateMultiplexed call. Owns itself through self_ until OnDone; the engine's
// listeners hold weak references, so a notification after OnDone is a no-op. mu_ is
// recursive because gRPC may run a reaction inline from StartRead/StartWrite/Finish.
// Lock order: mu_, then the engine's locks (the engine calls listeners holding none).
class MultiplexCall final : public grpc::ServerBidiReactor<MultiplexRequestPB, MultiplexOutputsPB>,
                            public std::enable_shared_from_this<MultiplexCall> {
 public:
  MultiplexCall(EngineCore& engine, int max_waiting) : engine_(engine), max_waiting_(max_waiting) {}

  void start() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    self_ = shared_from_this();
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (!ok) {  // the frontend half-closed (or is gone: OnCancel follows)
      reads_done_ = true;
      flush();
      return;
    }
    if (request_.cancel()) {
      forget(request_.tag());
    } else {
      begin(request_);
    }
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    writing_ = false;
    if (!ok) {  // the frontend is gone
      forget_all();
      finish(grpc::Status(grpc::StatusCode::CANCELLED, "frontend went away"));
      return;
    }
    flush();
  }

  void OnCancel() override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    forget_all();
    if (!writing_) finish(grpc::Status::CANCELLED);  // else OnWriteDone(false) finishes
  }

  void OnDone() override {
    std::shared_ptr<MultiplexCall> last;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      forget_all();
      last.swap(self_);
    }
    // `last` may be the final reference: *this is destroyed on return.
  }

 private:
  struct Entry {
    int64_t stream_id = 0;
    int64_t request_id = 0;
    bool streaming = false;
    bool dirty = false;  // queued in dirty_
    int sent = 0;        // generated tokens already sent
  };

  void begin(const MultiplexRequestPB& request) {
    const int64_t tag = request.tag();
    if (entries_.count(tag)) {  // a caller's bug: both requests end, with one last update
      forget(tag);
      fail(tag, invalid("", "tag " + std::to_string(tag) + " is in use"));
      return;
    }
    const GenerateInputPB& input = request.input();
    int64_t stream_id = 0;
    ErrorInfo error = enqueue_input(engine_, input, max_waiting_, &stream_id);
    if (!error.ok()) {
      fail(tag, error);
      return;
    }
    entries_[tag] = Entry{stream_id, input.request_id(), input.generate_config().is_streaming()};
    std::weak_ptr<MultiplexCall> weak = self_;
    engine_.set_listener(stream_id, [weak, tag] {
      if (auto call = weak.lock()) call->mark(tag);
    });
  }

  // A listener: the tag's stream has new tokens or ended.
  void mark(int64_t tag) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto it = entries_.find(tag);
    if (it == entries_.end() || it->second.dirty) return;
    it->second.dirty = true;
    dirty_.push_back(tag);
    flush();
  }

  // A request that failed before it had a stream: its only update carries the error.
  void fail(int64_t tag, const ErrorInfo& error) {
    failed_.emplace_back(tag, error);
    flush();
  }

  // Writes what every dirty tag has that the frontend has not seen, unless a write is pending.
  void flush() {
    if (writing_ || finishing_) return;
    message_.Clear();
    for (const auto& [tag, error] : failed_) add_error(tag, error);
    failed_.clear();
    for (int64_t tag : dirty_) collect(tag);
    dirty_.clear();
    if (message_.updates_size() > 0) {
      writing_ = true;
      StartWrite(&message_);
    } else if (reads_done_ && entries_.empty()) {
      finish(grpc::Status::OK);
    }
  }

  void collect(int64_t tag) {
    auto it = entries_.find(tag);
    if (it == entries_.end()) return;  // cancelled since it was marked
    Entry& entry = it->second;
    entry.dirty = false;
    if (!engine_.poll(entry.stream_id, entry.sent, &update_)) {
      add_error(tag, ErrorInfo(ErrorCode::UNKNOWN_ERROR, "stream vanished"));
      forget(tag);
      return;
    }
    const Send send = what_to_send(update_, entry.streaming);
    if (send == Send::kNothing) return;
    if (!update_.error.ok()) {
      add_error(tag, update_.error);
    } else {
      MultiplexUpdatePB* u = message_.add_updates();
      u->set_tag(tag);
      to_proto(entry.request_id, update_, EngineCore::now_us(), u->mutable_output());
      entry.sent = update_.num_generated;
    }
    if (send == Send::kLast) forget(tag);
  }

  void add_error(int64_t tag, const ErrorInfo& error) {
    MultiplexUpdatePB* u = message_.add_updates();
    u->set_tag(tag);
    u->set_status_code(static_cast<int32_t>(status_code(error)));
    *u->mutable_error() = error_details(error);
  }

  // Releases the tag's engine stream (aborting it if unfinished); no update follows.
  void forget(int64_t tag) {
    auto it = entries_.find(tag);
    if (it == entries_.end()) return;
    engine_.release(it->second.stream_id);
    entries_.erase(it);
  }

  void forget_all() {
    for (auto& [tag, entry] : entries_) engine_.release(entry.stream_id);
    entries_.clear();
    dirty_.clear();
    failed_.clear();
  }

  void finish(const grpc::Status& status) {
    if (finishing_) return;
    finishing_ = true;
    Finish(status);
  }

  EngineCore& engine_;
  const int max_waiting_;
  std::recursive_mutex mu_;
  std::shared_ptr<MultiplexCall> self_;
  std::unordered_map<int64_t, Entry> entries_;  // tag -> its engine stream
  std::vector<int64_t> dirty_;                  // tags with something new, in the order they got it
  std::vector<std::pair<int64_t, ErrorInfo>> failed_;
  bool reads_done_ = false;
  bool writing_ = false;
  bool finishing_ = false;
  MultiplexRequestPB request_;
  MultiplexOutputsPB message_;
  StreamUpdate update_;
};

}  // namespace

grpc::ServerBidiReactor<MultiplexRequestPB, MultiplexOutputsPB>* MultiplexService::GenerateMultiplexed(
    grpc::CallbackServerContext* context) {
  auto call = std::make_shared<MultiplexCall>(engine_, max_waiting(*context));
  call->start();
  return call.get();  // kept alive by its own self_ until OnDone
}

}  // namespace rtp_llm
