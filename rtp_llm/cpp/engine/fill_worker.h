// A thread that runs one C call at a time for a host that must not block on it, then opens a
// device gate: the grammar step's token-mask fill (xgrammar's batch fill, called through
// tvm-ffi's C ABI, TVMFFIFunctionCall), so that the fill never takes Python's GIL and the
// engine thread's Python never waits for the filling thread's (docs/serving_benchmarks.md,
// sessions 17-19).
//
// Invariants:
// - At most one call in flight: submit() refuses a second until wait() took the first's result.
// - The gate's counter receives the ticket (a release store, after everything the call wrote)
//   once the call returned, whatever it returned: a device stream held on that ticket is never
//   left waiting, and the caller learns of a failure from wait().
// - The call's arguments are copied at submit; what they point to stays the caller's to keep
//   alive until wait() returns.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace rtp_llm {

class FillWorker {
 public:
  // tvm-ffi's calling convention: args are num_args 16-byte records (TVMFFIAny), result one more.
  using Call = int (*)(void* func, void* args, int32_t num_args, void* result);
  static constexpr int kMaxArgs = 8;
  static constexpr int kArgBytes = 16;

  FillWorker();
  ~FillWorker();  // waits for the call in flight
  FillWorker(const FillWorker&) = delete;
  FillWorker& operator=(const FillWorker&) = delete;

  // False (nothing started) when a call is in flight or num_args is outside [0, kMaxArgs].
  // gate: nullptr, or the 64-bit counter that receives `ticket` once the call returned.
  bool submit(Call call, void* func, const void* args, int32_t num_args, int64_t* gate, int64_t ticket);
  // Blocks until the call submitted last returned: its return value (0 when none was submitted).
  // The call's result record is discarded: the call must return no object.
  int wait();

 private:
  enum class State { kIdle, kQueued, kDone };
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kIdle;
  bool stop_ = false;
  Call call_ = nullptr;
  void* func_ = nullptr;
  alignas(8) unsigned char args_[kMaxArgs * kArgBytes] = {};
  int32_t num_args_ = 0;
  int64_t* gate_ = nullptr;
  int64_t ticket_ = 0;
  int rc_ = 0;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace rtp_llm
