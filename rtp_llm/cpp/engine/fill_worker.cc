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

bool FillWorker::submit(Call call, void* func, const void* args, int32_t num_args, int64_t* gate, int64_t ticket) {
  if (num_args < 0 || num_args > kMaxArgs || call == nullptr) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kIdle) return false;
    call_ = call;
    func_ = func;
    if (num_args > 0) std::memcpy(args_, args, static_cast<size_t>(num_args) * kArgBytes);
    num_args_ = num_args;
    gate_ = gate;
    ticket_ = ticket;
    state_ = State::kQueued;
  }
  cv_.notify_all();
  return true;
}

int FillWorker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return state_ != State::kQueued; });
  const int rc = state_ == State::kDone ? rc_ : 0;
  state_ = State::kIdle;
  return rc;
}

void FillWorker::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || state_ == State::kQueued; });
    if (stop_) return;
    lock.unlock();  // (the call's inputs stay put: nothing changes them while kQueued)
    alignas(8) unsigned char result[kArgBytes] = {};
    const int rc = call_(func_, args_, num_args_, result);
    if (gate_ != nullptr) __atomic_store_n(gate_, ticket_, __ATOMIC_RELEASE);
    lock.lock();
    rc_ = rc;
    state_ = State::kDone;
    cv_.notify_all();
  }
}

}  // namespace rtp_llm
