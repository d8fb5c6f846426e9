#include "rtp_llm/cpp/engine/fill_worker.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace rtp_llm {
namespace {

// A call shaped like TVMFFIFunctionCall: func is a Probe, each 16-byte arg's second 8 bytes a
// value it sums into `out` and its result (a plain int, type index 1, or an object's index
// when `object` is set); it logs its order, blocks until `release` is set and returns `rc`.
struct Probe {
  std::atomic<bool> release{true};
  std::atomic<bool> running{false};
  int64_t out = 0;
  int rc = 0;
  bool object = false;
  std::thread::id thread;
  std::vector<int64_t>* order = nullptr;
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
  if (p->order != nullptr) p->order->push_back(sum);
  const int32_t type_index = p->object ? FillWorker::kFirstObjectType + 3 : 1;
  std::memcpy(result, &type_index, 4);
  std::memcpy(static_cast<unsigned char*>(result) + 8, &sum, 8);
  return p->rc;
}

// A job of calls on probes, each with its own args and result.
struct Job {
  std::vector<int64_t> words;   // [calls][4]: two 16-byte args per call
  std::vector<int64_t> results;  // [calls][2]
  std::vector<FillWorker::Spec> specs;
  Job(std::vector<Probe*> probes, std::vector<std::pair<int64_t, int64_t>> args)
      : words(4 * probes.size()), results(2 * probes.size(), -1) {
    for (size_t i = 0; i < probes.size(); ++i) {
      words[4 * i + 1] = args[i].first;
      words[4 * i + 3] = args[i].second;
      specs.push_back({ProbeCall, probes[i], &words[4 * i], 2, 0, &results[2 * i]});
    }
  }
  int n() const { return static_cast<int>(specs.size()); }
};

TEST(FillWorker, RunsTheCallsInOrderOnItsThreadWithTheirResults) {
  FillWorker w;
  std::vector<int64_t> order;
  Probe a, b;
  a.order = b.order = &order;
  Job job({&a, &b, &a}, {{5, 37}, {1, 2}, {10, 0}});
  ASSERT_TRUE(w.submit(job.specs.data(), job.n(), nullptr, 0));
  int32_t failed_at = 7;
  EXPECT_EQ(w.wait(&failed_at), 0);
  EXPECT_EQ(failed_at, -1);
  EXPECT_EQ(order, (std::vector<int64_t>{42, 3, 10}));
  EXPECT_EQ(job.results[1], 42);  // each call's own result record
  EXPECT_EQ(job.results[3], 3);
  EXPECT_NE(a.thread, std::this_thread::get_id());
  EXPECT_EQ(w.wait(), 0);  // nothing submitted since: returns at once
}

TEST(FillWorker, OpensTheGateOnlyOnceTheJobEnded) {
  FillWorker w;
  Probe first, last;
  last.release = false;
  int64_t gate = 3;
  Job job({&first, &last}, {{0, 0}, {0, 0}});
  ASSERT_TRUE(w.submit(job.specs.data(), job.n(), &gate, 4));
  while (!last.running) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(__atomic_load_n(&gate, __ATOMIC_ACQUIRE), 3);  // the last call still runs: still closed
  last.release = true;
  EXPECT_EQ(w.wait(), 0);
  EXPECT_EQ(gate, 4);
}

TEST(FillWorker, AFailedCallEndsTheJobStillOpensTheGateAndIsNamed) {
  FillWorker w;
  std::vector<int64_t> order;
  Probe ok, bad;
  ok.order = bad.order = &order;
  bad.rc = -1;
  int64_t gate = 0;
  Job job({&ok, &bad, &ok}, {{1, 0}, {2, 0}, {3, 0}});
  ASSERT_TRUE(w.submit(job.specs.data(), job.n(), &gate, 9));
  int32_t failed_at = -1;
  EXPECT_EQ(w.wait(&failed_at), -1);
  EXPECT_EQ(failed_at, 1);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2}));  // the call after the failure did not run
  EXPECT_EQ(gate, 9);
  bad.rc = 0;  // and the worker serves on
  ASSERT_TRUE(w.submit(job.specs.data(), job.n(), &gate, 10));
  EXPECT_EQ(w.wait(&failed_at), 0);
  EXPECT_EQ(failed_at, -1);
  EXPECT_EQ(gate, 10);
}

TEST(FillWorker, ACallThatGivesBackAnObjectFailsTheJob) {
  FillWorker w;
  Probe p;
  p.object = true;
  Job job({&p}, {{0, 0}});
  ASSERT_TRUE(w.submit(job.specs.data(), job.n(), nullptr, 0));
  int32_t failed_at = -1;
  EXPECT_EQ(w.wait(&failed_at), FillWorker::kResultIsObject);
  EXPECT_EQ(failed_at, 0);
}

TEST(FillWorker, RefusesASecondJobUntilTheFirstWasWaitedFor) {
  FillWorker w;
  Probe p;
  p.release = false;
  Job job({&p}, {{0, 0}});
  ASSERT_TRUE(w.submit(job.specs.data(), 1, nullptr, 0));
  EXPECT_FALSE(w.submit(job.specs.data(), 1, nullptr, 0));  // in flight
  p.release = true;
  w.wait();
  EXPECT_TRUE(w.submit(job.specs.data(), 1, nullptr, 0));
  w.wait();
}

TEST(FillWorker, RefusesAnEmptyJobAndFailsACallWithoutAFunction) {
  FillWorker w;
  Probe p;
  Job job({&p}, {{0, 0}});
  EXPECT_FALSE(w.submit(job.specs.data(), 0, nullptr, 0));
  EXPECT_FALSE(w.submit(nullptr, 1, nullptr, 0));
  EXPECT_EQ(w.wait(), 0);  // nothing was started
  job.specs[0].call = nullptr;  // a spec without a call fails where it stands
  ASSERT_TRUE(w.submit(job.specs.data(), 1, nullptr, 0));
  int32_t failed_at = -1;
  EXPECT_EQ(w.wait(&failed_at), -1);
  EXPECT_EQ(failed_at, 0);
}

TEST(FillWorker, DestroyingWaitsForTheJobInFlight) {
  Probe p;
  p.release = false;
  Job job({&p}, {{11, 0}});
  std::thread releaser;
  {
    FillWorker w;
    ASSERT_TRUE(w.submit(job.specs.data(), 1, nullptr, 0));
    while (!p.running) std::this_thread::yield();
    releaser = std::thread([&p] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      p.release = true;
    });
  }  // (the destructor returns only once the call did)
  EXPECT_EQ(p.out, 11);
  releaser.join();
}

// Plain C functions as a job's calls (call_c_function): a copy and a check, as the mask's copy to
// the device and the wait for it run on the worker.
int64_t copied[4];
int CopyWords(uint64_t dst, uint64_t src, uint64_t n) {
  std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n * 8);
  return 0;
}
int FailsWith(uint64_t code) { return static_cast<int>(code); }

TEST(FillWorker, CallsPlainCFunctionsWithTheirArgumentsAndStopsAtANonzeroReturn) {
  FillWorker w;
  const int64_t source[4] = {4, 3, 2, 1};
  uint64_t copy_args[3] = {reinterpret_cast<uint64_t>(copied), reinterpret_cast<uint64_t>(source), 4};
  uint64_t fail_args[1] = {700};
  int64_t results[6] = {};
  std::vector<FillWorker::Spec> specs = {
      {call_c_function, reinterpret_cast<void*>(CopyWords), copy_args, 3, 0, &results[0]},
      {call_c_function, reinterpret_cast<void*>(FailsWith), fail_args, 1, 0, &results[2]},
      {call_c_function, reinterpret_cast<void*>(CopyWords), copy_args, 5, 0, &results[4]},  // (never runs)
  };
  ASSERT_TRUE(w.submit(specs.data(), 3, nullptr, 0));
  int32_t failed_at = -1;
  EXPECT_EQ(w.wait(&failed_at), 700);
  EXPECT_EQ(failed_at, 1);
  EXPECT_EQ(copied[0], 4);
  EXPECT_EQ(copied[3], 1);
  EXPECT_EQ(results[3], 700);  // the function's return, as a plain int
  int64_t result[2];
  EXPECT_EQ(call_c_function(reinterpret_cast<void*>(FailsWith), fail_args, 5, result), -1);  // bad arity
}

}  // namespace
}  // namespace rtp_llm
