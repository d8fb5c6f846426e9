#include "rtp_llm/cpp/engine/fill_worker.h"

#include <cstring>

namespace rtp_llm {

FillWorker::FillWorker() : thread_([this] { run(); }) {}

FillWorker::~FillWorker() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return state_ != State::kQueued; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool FillWorker::submit(const Spec* specs, int32_t num_calls, int64_t* gate, int64_t ticket) {
  if (specs == nullptr || num_calls < 1) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kIdle) return false;
    specs_ = specs;
    num_calls_ = num_calls;
    gate_ = gate;
    ticket_ = ticket;
    state_ = State::kQueued;
  }
  cv_.notify_all();
  return true;
}

int FillWorker::wait(int32_t* failed_at) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return state_ != State::kQueued; });
  const bool done = state_ == State::kDone;
  if (failed_at != nullptr) *failed_at = done ? failed_at_ : -1;
  state_ = State::kIdle;
  return done ? rc_ : 0;
}

int FillWorker::run_job(int32_t* failed_at) const {
  for (int32_t i = 0; i < num_calls_; ++i) {
    const Spec& s = specs_[i];
    int rc = s.call != nullptr ? s.call(s.func, s.args, s.num_args, s.result) : -1;
    int32_t type_index;
    std::memcpy(&type_index, s.result, sizeof(type_index));
    if (rc == 0 && type_index >= kFirstObjectType) rc = kResultIsObject;
    if (rc != 0) {
      *failed_at = i;
      return rc;
    }
  }
  *failed_at = -1;
  return 0;
}

void FillWorker::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || state_ == State::kQueued; });
    if (stop_) return;
    lock.unlock();  // (the job's inputs stay put: nothing changes them while kQueued)
    int32_t failed_at;
    const int rc = run_job(&failed_at);
    if (gate_ != nullptr) __atomic_store_n(gate_, ticket_, __ATOMIC_RELEASE);
    lock.lock();
    rc_ = rc;
    failed_at_ = failed_at;
    state_ = State::kDone;
    cv_.notify_all();
  }
}

int call_c_function(void* func, void* args, int32_t num_args, void* result) {
  using U = uint64_t;
  const U* a = static_cast<const U*>(args);
  int rc = -1;
  switch (num_args) {
    case 1: rc = reinterpret_cast<int (*)(U)>(func)(a[0]); break;
    case 2: rc = reinterpret_cast<int (*)(U, U)>(func)(a[0], a[1]); break;
    case 3: rc = reinterpret_cast<int (*)(U, U, U)>(func)(a[0], a[1], a[2]); break;
    case 4: rc = reinterpret_cast<int (*)(U, U, U, U)>(func)(a[0], a[1], a[2], a[3]); break;
    default: break;
  }
  const int32_t type_index = 1;  // tvm-ffi's kTVMFFIInt: a plain value
  const int64_t value = rc;
  std::memset(result, 0, 16);
  std::memcpy(result, &type_index, sizeof(type_index));
  std::memcpy(static_cast<unsigned char*>(result) + 8, &value, sizeof(value));
  return rc;
}

}  // namespace rtp_llm
