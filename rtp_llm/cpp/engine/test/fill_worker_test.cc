#include "rtp_llm/cpp/engine/fill_worker.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

namespace rtp_llm {
namespace {

// A call shaped like TVMFFIFunctionCall: func is a Probe, each 16-byte arg's second 8 bytes a
// value it sums into `out`; it blocks until `release` is set and returns `rc`.
struct Probe {
  std::atomic<bool> release{true};
  std::atomic<bool> running{false};
  int64_t out = 0;
  int rc = 0;
  std::thread::id thread;
};

int ProbeCall(void* func, void* args, int32_t num_args, void* result) {
  auto* p = static_cast<Probe*>(func);
  p->running = true;
  p->thread = std::this_thread::get_id();
  while (!p->release) std::this_thread::yield();
  int64_t sum = 0;
  for (int32_t i = 0; i < num_args; ++i) {
    int64_t v;
    std::memcpy(&v, static_cast<unsigned char*>(args) + 16 * i + 8, 8);
    sum += v;
  }
  p->out = sum;
  std::memset(result, 0, 16);
  return p->rc;
}

struct Args {
  int64_t words[2 * FillWorker::kMaxArgs] = {};
  void set(int i, int64_t v) { words[2 * i + 1] = v; }
};

TEST(FillWorker, RunsTheCallOnItsThreadAndReturnsItsResult) {
  FillWorker w;
  Probe p;
  Args a;
  a.set(0, 5);
  a.set(1, 37);
  ASSERT_TRUE(w.submit(ProbeCall, &p, a.words, 2, nullptr, 0));
  EXPECT_EQ(w.wait(), 0);
  EXPECT_EQ(p.out, 42);
  EXPECT_NE(p.thread, std::this_thread::get_id());
  EXPECT_EQ(w.wait(), 0);  // nothing submitted since: returns at once
}

TEST(FillWorker, CopiesTheArgumentsAtSubmit) {
  FillWorker w;
  Probe p;
  p.release = false;
  Args a;
  a.set(0, 7);
  ASSERT_TRUE(w.submit(ProbeCall, &p, a.words, 1, nullptr, 0));
  a.set(0, 1000);  // the caller reuses its buffer while the call runs
  p.release = true;
  w.wait();
  EXPECT_EQ(p.out, 7);
}

TEST(FillWorker, OpensTheGateOnlyOnceTheCallReturned) {
  FillWorker w;
  Probe p;
  p.release = false;
  int64_t gate = 3;
  Args a;
  ASSERT_TRUE(w.submit(ProbeCall, &p, a.words, 0, &gate, 4));
  while (!p.running) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(__atomic_load_n(&gate, __ATOMIC_ACQUIRE), 3);  // still running: still closed
  p.release = true;
  EXPECT_EQ(w.wait(), 0);
  EXPECT_EQ(gate, 4);
}

TEST(FillWorker, AFailedCallStillOpensTheGateAndReportsItsCode) {
  FillWorker w;
  Probe p;
  p.rc = -1;
  int64_t gate = 0;
  Args a;
  ASSERT_TRUE(w.submit(ProbeCall, &p, a.words, 0, &gate, 9));
  EXPECT_EQ(w.wait(), -1);
  EXPECT_EQ(gate, 9);
  p.rc = 0;  // and the worker serves on
  ASSERT_TRUE(w.submit(ProbeCall, &p, a.words, 0, &gate, 10));
  EXPECT_EQ(w.wait(), 0);
  EXPECT_EQ(gate, 10);
}

TEST(FillWorker, RefusesASecondCallUntilTheFirstWasWaitedFor) {
  FillWorker w;
  Probe p;
  p.release = false;
  Args a;
  ASSERT_TRUE(w.submit(ProbeCall, &p, a.words, 0, nullptr, 0));
  EXPECT_FALSE(w.submit(ProbeCall, &p, a.words, 0, nullptr, 0));  // in flight
  p.release = true;
  w.wait();
  EXPECT_TRUE(w.submit(ProbeCall, &p, a.words, 0, nullptr, 0));
  w.wait();
}

TEST(FillWorker, RefusesBadArgumentCounts) {
  FillWorker w;
  Probe p;
  Args a;
  EXPECT_FALSE(w.submit(ProbeCall, &p, a.words, -1, nullptr, 0));
  EXPECT_FALSE(w.submit(ProbeCall, &p, a.words, FillWorker::kMaxArgs + 1, nullptr, 0));
  EXPECT_EQ(w.wait(), 0);  // nothing was started
}

TEST(FillWorker, DestroyingWaitsForTheCallInFlight) {
  Probe p;
  p.release = false;
  Args a;
  a.set(0, 11);
  std::thread releaser;
  {
    FillWorker w;
    ASSERT_TRUE(w.submit(ProbeCall, &p, a.words, 1, nullptr, 0));
    while (!p.running) std::this_thread::yield();
    releaser = std::thread([&p] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      p.release = true;
    });
  }  // (the destructor returns only once the call did)
  EXPECT_EQ(p.out, 11);
  releaser.join();
}

}  // namespace
}  // namespace rtp_llm
