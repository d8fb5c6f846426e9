#include "rtp_llm/cpp/engine/engine_core.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "rtp_llm/cpp/engine/test/engine_core_test_util.h"
#include "rtp_llm/cpp/engine/test/fake_model.h"

namespace rtp_llm {
namespace {

using namespace testing;  // NOLINT: FakeModel and the shared helpers
TEST(EngineCore, ManySharedPrefixStreamsUnderMemoryPressureMatchTheReference) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  std::mt19937 rng(7);
  std::vector<int32_t> system_prompt = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  std::vector<std::pair<int64_t, std::vector<int32_t>>> requests;
  for (int i = 0; i < 40; ++i) {
    std::vector<int32_t> prompt = i % 2 ? system_prompt : std::vector<int32_t>{};
    const int extra = 1 + static_cast<int>(rng() % 12);
    for (int j = 0; j < extra; ++j) prompt.push_back(static_cast<int32_t>(rng() % 500));
    int64_t id;
    ASSERT_TRUE(engine.enqueue(prompt, MaxNew(1 + static_cast<int>(rng() % 20)), &id).ok());
    requests.emplace_back(id, prompt);
    if (i % 3 == 0) Step(engine, model);  // arrivals interleave with steps
  }
  while (Step(engine, model)) {
  }
  int64_t generated = 0;
  for (auto& [id, prompt] : requests) {
    StreamUpdate u;
    ASSERT_TRUE(engine.poll(id, 0, &u));
    EXPECT_EQ(u.status, StreamStatus::FINISHED);
    EXPECT_EQ(u.new_tokens, model.reference(prompt, u.num_generated)) << "stream " << id;
    generated += u.num_generated;
  }
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.generated_tokens, generated);  // a preempted stream's tokens are not counted twice
  EXPECT_GT(s.preemptions, 0);      // the pool was too small for everyone at once
  EXPECT_GT(s.kv.hit_tokens, 0);    // the shared system prompt was reused
  ExpectAllBlocksBack(engine);
}

TEST(EngineCore, AdmissionRejectsWhatCanNeverRun) {
  EngineCoreConfig c = SmallConfig();
  c.max_seq_len = 1000;  // larger than the cache (24 blocks x 4 = 96 tokens)
  EngineCore engine(c);
  int64_t id;
  ErrorInfo e = engine.enqueue({}, MaxNew(4), &id);
  EXPECT_EQ(e.code, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(e.field, "token_ids");
  e = engine.enqueue(std::vector<int32_t>(96, 1), MaxNew(4), &id);
  EXPECT_EQ(e.code, ErrorCode::EXCEEDS_KV_CACHE_MAX_LEN);
  EXPECT_EQ(e.field, "token_ids");
  EXPECT_NE(e.message.find("96"), std::string::npos) << e.message;
  GenerateConfig bad = MaxNew(4);
  bad.min_new_tokens = -1;
  e = engine.enqueue(std::vector<int32_t>(3, 1), bad, &id);
  EXPECT_NE(e.message.find("min_new_tokens"), std::string::npos);
  EXPECT_EQ(e.field, "min_new_tokens");
  e = engine.enqueue(std::vector<int32_t>(3, 1), MaxNew(0), &id);
  EXPECT_EQ(e.field, "max_new_tokens");

  EngineCoreConfig d = SmallConfig();
  EngineCore short_engine(d);
  e = short_engine.enqueue(std::vector<int32_t>(64, 1), MaxNew(4), &id);
  EXPECT_EQ(e.code, ErrorCode::LONG_PROMPT_ERROR);
  EXPECT_EQ(e.field, "token_ids");
  EXPECT_NE(e.message.find("max_seq_len"), std::string::npos);
}

TEST(EngineCore, ConfigRefusesAHistoryBeyondInt32) {
  EngineCoreConfig c = SmallConfig();
  EXPECT_TRUE(c.validate().ok());
  c.max_batch_size = 2048;
  c.max_seq_len = 1 << 20;  // 2^31 history tokens: one past what int32 indexes
  ErrorInfo e = c.validate();
  EXPECT_EQ(e.code, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(e.field, "max_seq_len");
  EXPECT_NE(e.message.find("max_batch_size * max_seq_len"), std::string::npos) << e.message;
  c.max_seq_len = (1 << 20) - 1;
  EXPECT_TRUE(c.validate().ok());
}

// Runs one request to its end; returns its final update.
StreamUpdate RunAlone(EngineCoreConfig c, std::vector<int32_t> prompt, GenerateConfig g) {
  EngineCore engine(c);
  FakeModel model(c.num_blocks, c.block_size);
  int64_t id;
  EXPECT_TRUE(engine.enqueue(prompt, g, &id).ok());
  StreamUpdate u;
  EXPECT_TRUE(engine.poll(id, 0, &u));
  EXPECT_EQ(u.finish_reason, "");  // unfinished
  while (Step(engine, model)) {
  }
  EXPECT_TRUE(engine.poll(id, 0, &u));
  EXPECT_EQ(u.status, StreamStatus::FINISHED);
  return u;
}

TEST(EngineCore, FinishReasonIsLengthAtEitherLimitAndStopAtEosOrAStopWord) {
  FakeModel model(24, 4);
  const std::vector<int32_t> prompt = {4, 5, 6};
  const auto expected = model.reference(prompt, 8);
  StreamUpdate u = RunAlone(SmallConfig(), prompt, MaxNew(8));
  EXPECT_EQ(u.finish_reason, "length");  // max_new_tokens
  EXPECT_EQ(u.num_generated, 8);

  EngineCoreConfig c = SmallConfig();
  c.max_seq_len = 10;
  u = RunAlone(c, prompt, MaxNew(50));
  EXPECT_EQ(u.finish_reason, "length");  // max_seq_len
  EXPECT_EQ(u.prompt_len + u.num_generated, 10);

  c = SmallConfig();
  c.eos_token_ids = {expected[3]};
  u = RunAlone(c, prompt, MaxNew(8));
  EXPECT_EQ(u.finish_reason, "stop");  // EOS
  EXPECT_EQ(u.new_tokens, std::vector<int32_t>(expected.begin(), expected.begin() + 4));

  GenerateConfig g = MaxNew(8);
  g.stop_words_list = {{expected[1], expected[2]}};
  u = RunAlone(SmallConfig(), prompt, g);
  EXPECT_EQ(u.finish_reason, "stop");  // a stop-word sequence
  EXPECT_EQ(u.new_tokens, std::vector<int32_t>(expected.begin(), expected.begin() + 3));
}

TEST(EngineCore, AWaitingQueueCapRefusesTheExcessUntilTheQueueMoves) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  int64_t a, b, c;
  ASSERT_TRUE(engine.enqueue({1, 2}, MaxNew(2), &a, 2).ok());
  ASSERT_TRUE(engine.enqueue({3, 4}, MaxNew(2), &b, 2).ok());
  ErrorInfo e = engine.enqueue({5, 6}, MaxNew(2), &c, 2);
  EXPECT_EQ(e.code, ErrorCode::CONCURRENCY_LIMIT_ERROR);
  EXPECT_NE(e.message.find("waiting queue"), std::string::npos) << e.message;
  EXPECT_EQ(engine.stats().waiting, 2);                   // the refused one left no trace
  ASSERT_TRUE(engine.enqueue({5, 6}, MaxNew(2), &c).ok());  // no cap: admitted
  ASSERT_TRUE(Step(engine, model));                         // the queue moves into the batch
  EXPECT_TRUE(engine.enqueue({7, 8}, MaxNew(2), &c, 2).ok());
  while (Step(engine, model)) {
  }
  ExpectAllBlocksBack(engine);
}

TEST(EngineCore, GenerationStopsAtTheCacheCapacityInsteadOfWaitingForever) {
  EngineCoreConfig c = SmallConfig();
  c.max_seq_len = 1000;
  EngineCore engine(c);
  FakeModel model(24, 4);
  int64_t id;
  ASSERT_TRUE(engine.enqueue(std::vector<int32_t>(90, 3), MaxNew(100), &id).ok());
  while (Step(engine, model)) {
  }
  StreamUpdate u;
  engine.poll(id, 0, &u);
  EXPECT_EQ(u.status, StreamStatus::FINISHED);
  EXPECT_EQ(u.finish_reason, "length");
  EXPECT_EQ(u.prompt_len + u.num_generated, 96);
}

TEST(EngineCore, CancelMidPrefillAndMidDecodeFreesBlocks) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  int64_t prefill_id, decode_id;
  ASSERT_TRUE(engine.enqueue(std::vector<int32_t>(40, 5), MaxNew(10), &prefill_id).ok());  // 3 chunks of 16
  ASSERT_TRUE(engine.enqueue({1, 2, 3}, MaxNew(50), &decode_id).ok());

  // In flight: the abort is deferred to commit, which must not append tokens.
  const StepBatch& b = engine.schedule();
  ASSERT_EQ(b.num_streams, 1);  // the long prompt used the whole budget
  EXPECT_TRUE(engine.abort(prefill_id));
  auto tokens = model.run(b);
  ASSERT_TRUE(engine.commit(tokens.data(), nullptr, static_cast<int>(tokens.size())).ok());
  StreamUpdate u;
  engine.poll(prefill_id, 0, &u);
  EXPECT_EQ(u.status, StreamStatus::CANCELLED);
  EXPECT_EQ(u.error.code, ErrorCode::CANCELLED);
  EXPECT_EQ(u.num_generated, 0);

  for (int i = 0; i < 5; ++i) Step(engine, model);
  engine.poll(decode_id, 0, &u);
  EXPECT_EQ(u.status, StreamStatus::RUNNING);
  EXPECT_GT(u.num_generated, 0);
  EXPECT_TRUE(engine.abort(decode_id));  // not in flight: freed now
  engine.poll(decode_id, 0, &u);
  EXPECT_EQ(u.status, StreamStatus::CANCELLED);
  ExpectAllBlocksBack(engine);
  EXPECT_FALSE(engine.abort(12345));
}


TEST(EngineCore, TimeoutEndsAStreamWithGenerateTimeout) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  const int64_t id = EnqueueTimingOut(engine);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  StreamUpdate u;
  while (std::chrono::steady_clock::now() < deadline) {
    Step(engine, model);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    engine.poll(id, 0, &u);
    if (u.done()) break;
  }
  EXPECT_EQ(u.status, StreamStatus::ERROR);
  EXPECT_EQ(u.error.code, ErrorCode::GENERATE_TIMEOUT);
  EXPECT_EQ(u.error.field, "timeout_ms");
  EXPECT_EQ(u.finish_reason, "");
  ExpectAllBlocksBack(engine);
}

TEST(EngineCore, AFailedBatchFailsOnlyItsStreams) {
  EngineCoreConfig c = SmallConfig();
  c.max_batch_size = 1;  // the second stream waits outside the failing step
  EngineCore engine(c);
  FakeModel model(24, 4);
  int64_t bad, good;
  ASSERT_TRUE(engine.enqueue({1, 2, 3}, MaxNew(5), &bad).ok());
  ASSERT_TRUE(engine.enqueue({4, 5, 6}, MaxNew(5), &good).ok());
  ASSERT_EQ(engine.schedule().num_streams, 1);
  ASSERT_TRUE(engine.fail_batch("injected failure").ok());
  EXPECT_FALSE(engine.fail_batch("twice").ok());  // nothing outstanding any more
  StreamUpdate u;
  engine.poll(bad, 0, &u);
  EXPECT_EQ(u.status, StreamStatus::ERROR);
  EXPECT_EQ(u.error.code, ErrorCode::EXECUTION_EXCEPTION);
  EXPECT_EQ(u.error.message, "injected failure");
  while (Step(engine, model)) {
  }
  EXPECT_EQ(Generated(engine, good), model.reference({4, 5, 6}, 5));
  ExpectAllBlocksBack(engine);
}

TEST(EngineCore, CommitChecksTheTokenCount) {
  EngineCore engine(SmallConfig());
  int64_t id;
  ASSERT_TRUE(engine.enqueue({1, 2, 3}, MaxNew(2), &id).ok());
  EXPECT_FALSE(engine.commit(nullptr, nullptr, 0).ok());  // nothing scheduled
  const StepBatch& b = engine.schedule();
  ASSERT_EQ(b.num_sampled, 1);
  int32_t two[2] = {1, 2};
  ErrorInfo e = engine.commit(two, nullptr, 2);
  EXPECT_EQ(e.code, ErrorCode::INVALID_PARAMS);
  EXPECT_TRUE(engine.commit(two, nullptr, 1).ok());
}

TEST(EngineCore, StopTokensAndLogprobsFlowThrough) {
  EngineCoreConfig c = SmallConfig();
  FakeModel model(24, 4);
  std::vector<int32_t> prompt = {4, 5, 6};
  auto expected = model.reference(prompt, 5);
  c.eos_token_ids = {expected[2]};
  EngineCore engine(c);
  GenerateConfig g = MaxNew(5);
  g.return_logprobs = true;
  int64_t id;
  ASSERT_TRUE(engine.enqueue(prompt, g, &id).ok());
  for (;;) {
    const StepBatch& b = engine.schedule();
    if (b.num_streams == 0) break;
    auto tokens = model.run(b);
    std::vector<float> lp(tokens.size(), -1.5f);
    ASSERT_TRUE(engine.commit(tokens.data(), lp.data(), static_cast<int>(tokens.size())).ok());
  }
  StreamUpdate u;
  engine.poll(id, 1, &u);  // from the second generated token on
  EXPECT_EQ(u.new_tokens, std::vector<int32_t>(expected.begin() + 1, expected.begin() + 3));
  EXPECT_EQ(u.new_logprobs, std::vector<float>(2, -1.5f));
  EXPECT_EQ(u.finish_reason, "stop");
}

TEST(EngineCore, AlternativesFlowFromCommitToPoll) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  GenerateConfig g = MaxNew(3);
  g.top_logprobs = 1;
  int64_t id;
  ASSERT_TRUE(engine.enqueue({4, 5, 6}, g, &id).ok());
  for (int step = 0;; ++step) {
    const StepBatch& b = engine.schedule();
    if (b.num_streams == 0) break;
    auto tokens = model.run(b);
    // Two alternatives per row (the batch's k); this stream keeps its first.
    std::vector<int32_t> ids(tokens.size() * 2, 100 + step);
    std::vector<float> lps(tokens.size() * 2, -0.25f * step);
    ASSERT_TRUE(engine.commit({tokens.data(), nullptr, ids.data(), lps.data(), 2}, static_cast<int>(tokens.size())).ok());
  }
  StreamUpdate u;
  engine.poll(id, 1, &u);
  EXPECT_EQ(u.top_logprobs, 1);
  EXPECT_EQ(u.new_top_ids, (std::vector<int32_t>{101, 102}));
  EXPECT_EQ(u.new_top_logprobs, (std::vector<float>{-0.25f, -0.5f}));
  EXPECT_FALSE(engine.commit({nullptr, nullptr, nullptr, nullptr, RTP_LLM_MAX_TOP_LOGPROBS + 1}, 0).ok());
}

TEST(EngineCore, ListenersHearEveryUpdateAndWaitForWorkWakesUp) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  EXPECT_FALSE(engine.wait_for_work(1));
  std::atomic<bool> stop{false};
  std::thread loop([&] {
    while (!stop) {
      if (engine.wait_for_work(10)) Step(engine, model);
    }
  });
  int64_t id;
  ASSERT_TRUE(engine.enqueue({7, 8, 9}, MaxNew(30), &id).ok());
  std::atomic<int> calls{0};
  std::atomic<bool> finished{false};
  engine.set_listener(id, [&] {
    ++calls;
    StreamUpdate u;
    engine.poll(id, 0, &u);
    if (u.done()) finished = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!finished && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stop = true;
  loop.join();
  EXPECT_TRUE(finished);
  EXPECT_GE(calls.load(), 1);
  EXPECT_EQ(Generated(engine, id), model.reference({7, 8, 9}, 30));
  engine.release(id);
  StreamUpdate u;
  EXPECT_FALSE(engine.poll(id, 0, &u));
  EXPECT_EQ(engine.stats().tracked_streams, 0);
}

}  // namespace
}  // namespace rtp_llm
