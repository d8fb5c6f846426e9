// A thread that runs a job of C calls for a host that must not block on them, then opens a
// device gate: the grammar step's matcher work (each matcher accepting the token its stream
// kept, then xgrammar's batch mask fill, both called through tvm-ffi's C ABI,
// TVMFFIFunctionCall; then, where the device allows, the mask's copy to the device, through
// plain C calls of its driver: call_c_function), so that it never takes Python's GIL and the
// engine thread's Python never waits for the filling thread's (docs/serving_benchmarks.md,
// sessions 17-20).
//
// Invariants:
// - At most one job in flight: submit() refuses a second until wait() took the first's result.
// - A job's calls run in order, on the worker's thread; the first that fails (returns nonzero,
//   or gives back an object where only plain values are allowed) ends the job: the ones after it
//   do not run.
// - The gate's counter receives the ticket (a release store, after everything the calls wrote)
//   once the job ended, however it ended: a device stream held on that ticket is never left
//   waiting, and the caller learns of a failure from wait().
// - The calls, their arguments, their results and what the arguments point to stay the
//   caller's, untouched by it and alive, from submit() until wait() returns.
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
  // One call of a job (the C ABI's RtpFillCallSpec, same layout): call(func, args, num_args,
  // result). result: 16 bytes the call writes; it must hold a plain value (a type index below
  // kFirstObjectType), never an object, which nothing here could release.
  struct Spec {
    Call call;
    void* func;
    void* args;
    int32_t num_args;
    int32_t reserved;
    void* result;
  };
  static constexpr int32_t kFirstObjectType = 64;  // tvm-ffi's kTVMFFIStaticObjectBegin
  static constexpr int kResultIsObject = -2;       // wait()'s code for a call that gave an object

  FillWorker();
  ~FillWorker();  // waits for the job in flight
  FillWorker(const FillWorker&) = delete;
  FillWorker& operator=(const FillWorker&) = delete;

  // False (nothing started) while a job is in flight, or for no specs / num_calls < 1.
  // gate: nullptr, or the 64-bit counter that receives `ticket` once the job ended.
  bool submit(const Spec* specs, int32_t num_calls, int64_t* gate, int64_t ticket);
  // Blocks until the job submitted last ended: 0, the failing call's code, or kResultIsObject
  // (0 when none was submitted). failed_at (may be null): the failing call's index, or -1.
  int wait(int32_t* failed_at = nullptr);

 private:
  enum class State { kIdle, kQueued, kDone };
  void run();
  int run_job(int32_t* failed_at) const;

  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kIdle;
  bool stop_ = false;
  const Spec* specs_ = nullptr;
  int32_t num_calls_ = 0;
  int64_t* gate_ = nullptr;
  int64_t ticket_ = 0;
  int rc_ = 0;
  int32_t failed_at_ = -1;
  std::thread thread_;  // last: started once the members above exist
};

// A Call that calls a plain C function: func is `int f(a_0, ..., a_{n-1})` taking num_args (1 to
// 4) pointer-sized integer arguments, args those n 64-bit values (e.g. the CUDA driver's
// cuMemcpyHtoDAsync, cuStreamSynchronize). The result record gets f's return value as a plain
// int; the call returns it too (nonzero fails the job), or -1 for a num_args outside [1, 4].
int call_c_function(void* func, void* args, int32_t num_args, void* result);

}  // namespace rtp_llm
