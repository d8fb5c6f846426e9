#include "rtp_llm/cpp/engine/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "rtp_llm/cpp/engine/test/fake_model.h"

namespace rtp_llm {
namespace {

using testing::FakeModel;

EngineConfig SmallConfig() {
  EngineConfig c;
  c.num_blocks = 24;
  c.block_size = 4;
  c.max_batch_size = 8;
  c.max_num_batched_tokens = 16;
  c.max_seq_len = 64;
  return c;
}

GenerateConfig MaxNew(int n) {
  GenerateConfig g;
  g.max_new_tokens = n;
  return g;
}

// Runs one step with the fake model; returns false when there was nothing to run.
bool Step(Engine& engine, FakeModel& model) {
  const StepBatch& b = engine.schedule();
  if (b.num_streams == 0) return false;
  auto tokens = model.run(b);
  EXPECT_TRUE(engine.commit(tokens.data(), nullptr, static_cast<int>(tokens.size())).ok());
  return true;
}

void ExpectAllBlocksBack(Engine& engine) {
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.kv.used_blocks, 0);
  EXPECT_EQ(s.kv.free_blocks + s.kv.cached_blocks, s.kv.total_blocks);
  EXPECT_EQ(s.running + s.waiting, 0);
}

std::vector<int32_t> Generated(Engine& engine, int64_t id) {
  StreamUpdate u;
  EXPECT_TRUE(engine.poll(id, 0, &u));
  return u.new_tokens;
}

TEST(Engine, ManySharedPrefixStreamsUnderMemoryPressureMatchTheReference) {
  Engine engine(SmallConfig());
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
  for (auto& [id, prompt] : requests) {
    StreamUpdate u;
    ASSERT_TRUE(engine.poll(id, 0, &u));
    EXPECT_EQ(u.status, StreamStatus::FINISHED);
    EXPECT_EQ(u.new_tokens, model.reference(prompt, u.num_generated)) << "stream " << id;
  }
  const EngineStats s = engine.stats();
  EXPECT_GT(s.preemptions, 0);      // the pool was too small for everyone at once
  EXPECT_GT(s.kv.hit_tokens, 0);    // the shared system prompt was reused
  ExpectAllBlocksBack(engine);
}

TEST(Engine, AdmissionRejectsWhatCanNeverRun) {
  EngineConfig c = SmallConfig();
  c.max_seq_len = 1000;  // larger than the cache (24 blocks x 4 = 96 tokens)
  Engine engine(c);
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

  EngineConfig d = SmallConfig();
  Engine short_engine(d);
  e = short_engine.enqueue(std::vector<int32_t>(64, 1), MaxNew(4), &id);
  EXPECT_EQ(e.code, ErrorCode::LONG_PROMPT_ERROR);
  EXPECT_EQ(e.field, "token_ids");
  EXPECT_NE(e.message.find("max_seq_len"), std::string::npos);
}

// Runs one request to its end; returns its final update.
StreamUpdate RunAlone(EngineConfig c, std::vector<int32_t> prompt, GenerateConfig g) {
  Engine engine(c);
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

TEST(Engine, FinishReasonIsLengthAtEitherLimitAndStopAtEosOrAStopWord) {
  FakeModel model(24, 4);
  const std::vector<int32_t> prompt = {4, 5, 6};
  const auto expected = model.reference(prompt, 8);
  StreamUpdate u = RunAlone(SmallConfig(), prompt, MaxNew(8));
  EXPECT_EQ(u.finish_reason, "length");  // max_new_tokens
  EXPECT_EQ(u.num_generated, 8);

  EngineConfig c = SmallConfig();
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

TEST(Engine, AWaitingQueueCapRefusesTheExcessUntilTheQueueMoves) {
  Engine engine(SmallConfig());
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

TEST(Engine, GenerationStopsAtTheCacheCapacityInsteadOfWaitingForever) {
  EngineConfig c = SmallConfig();
  c.max_seq_len = 1000;
  Engine engine(c);
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

TEST(Engine, CancelMidPrefillAndMidDecodeFreesBlocks) {
  Engine engine(SmallConfig());
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

// A stream that would run to max_seq_len (64) but times out after 20 ms.
int64_t EnqueueTimingOut(Engine& engine) {
  GenerateConfig g = MaxNew(1000);
  g.timeout_ms = 20;
  g.ignore_eos = true;
  int64_t id = 0;
  EXPECT_TRUE(engine.enqueue({1, 2, 3}, g, &id).ok());
  return id;
}

TEST(Engine, TimeoutEndsAStreamWithGenerateTimeout) {
  Engine engine(SmallConfig());
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

TEST(Engine, AFailedBatchFailsOnlyItsStreams) {
  EngineConfig c = SmallConfig();
  c.max_batch_size = 1;  // the second stream waits outside the failing step
  Engine engine(c);
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

TEST(Engine, CommitChecksTheTokenCount) {
  Engine engine(SmallConfig());
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

TEST(Engine, StopTokensAndLogprobsFlowThrough) {
  EngineConfig c = SmallConfig();
  FakeModel model(24, 4);
  std::vector<int32_t> prompt = {4, 5, 6};
  auto expected = model.reference(prompt, 5);
  c.eos_token_ids = {expected[2]};
  Engine engine(c);
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

// Drives the engine as an overlapping model runner does: each batch is scheduled ahead of
// the previous one's tokens and run (on the device, in order) before that one commits.
// Returns how many batches ran on placeholders.
int RunOverlapped(Engine& engine, FakeModel& model, const std::function<void()>& between_steps = {}) {
  std::vector<int32_t> in_flight;  // tokens of the uncommitted batch
  bool have = false;
  int ahead = 0;
  for (int i = 0; i < 100000; ++i) {
    if (between_steps) between_steps();
    const StepBatch& next = engine.schedule_ahead();
    const bool ran = next.num_streams > 0;
    std::vector<int32_t> out;
    if (ran) {
      bool placeholders = false;
      for (int t = 0; t < next.num_tokens; ++t) placeholders |= next.token_ids[t] < 0;
      ahead += placeholders;
      EXPECT_TRUE(!placeholders || have);
      out = model.run(next, have ? &in_flight : nullptr);
    }
    if (have) {
      EXPECT_TRUE(engine.commit(in_flight.data(), nullptr, static_cast<int>(in_flight.size())).ok());
    }
    if (!ran && !have) break;
    in_flight = std::move(out);
    have = ran;
  }
  return ahead;
}

std::vector<int32_t> UpToStop(std::vector<int32_t> tokens, const std::vector<int32_t>& eos) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (std::find(eos.begin(), eos.end(), tokens[i]) != eos.end()) return {tokens.begin(), tokens.begin() + i + 1};
  }
  return tokens;
}

TEST(Engine, OverlappedStepsMatchTheReferenceUnderPressureWithStopsAndCancels) {
  EngineConfig c = SmallConfig();
  for (int32_t t = 3; t < 1000; t += 37) c.eos_token_ids.push_back(t);  // ~3% of tokens stop a stream
  Engine engine(c);
  FakeModel model(24, 4);
  std::mt19937 rng(11);
  std::vector<int32_t> system_prompt = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  std::vector<std::tuple<int64_t, std::vector<int32_t>, int>> requests;
  std::vector<int64_t> cancelled;
  int arrivals = 0;
  auto arrive_one = [&] {
    std::vector<int32_t> prompt = arrivals % 2 ? system_prompt : std::vector<int32_t>{};
    const int extra = 1 + static_cast<int>(rng() % 12);
    for (int j = 0; j < extra; ++j) prompt.push_back(static_cast<int32_t>(rng() % 500));
    const int max_new = 1 + static_cast<int>(rng() % 20);
    int64_t id;
    ASSERT_TRUE(engine.enqueue(prompt, MaxNew(max_new), &id).ok());
    requests.emplace_back(id, prompt, max_new);
    if (++arrivals % 7 == 0) {  // cancel an earlier one, likely while it is in flight
      cancelled.push_back(std::get<0>(requests[requests.size() / 2]));
      engine.abort(cancelled.back());
    }
  };
  auto arrive = [&] {
    for (int burst = 0; burst < 3 && arrivals < 40; ++burst) arrive_one();
  };
  const int ahead = RunOverlapped(engine, model, arrive);
  EXPECT_GT(ahead, 10);
  for (auto& [id, prompt, max_new] : requests) {
    StreamUpdate u;
    ASSERT_TRUE(engine.poll(id, 0, &u));
    const auto expected = UpToStop(model.reference(prompt, max_new), c.eos_token_ids);
    if (std::find(cancelled.begin(), cancelled.end(), id) != cancelled.end() && u.status == StreamStatus::CANCELLED) {
      EXPECT_EQ(u.new_tokens, std::vector<int32_t>(expected.begin(), expected.begin() + u.num_generated));
      continue;
    }
    EXPECT_EQ(u.status, StreamStatus::FINISHED) << "stream " << id;
    EXPECT_EQ(u.new_tokens, expected) << "stream " << id;  // nothing after a stop, nothing lost
  }
  ExpectAllBlocksBack(engine);
}

TEST(Engine, OverlappedStepsFallBackToARegularStepThatPreempts) {
  EngineConfig c = SmallConfig();
  c.num_blocks = 5;  // two streams of 7 prompt tokens both need a third block at position 8
  Engine engine(c);
  FakeModel model(5, 4);
  int64_t a, b;
  ASSERT_TRUE(engine.enqueue({1, 2, 3, 4, 5, 6, 7}, MaxNew(8), &a).ok());
  ASSERT_TRUE(engine.enqueue({8, 9, 10, 11, 12, 13, 14}, MaxNew(8), &b).ok());
  EXPECT_GT(RunOverlapped(engine, model), 0);
  EXPECT_EQ(Generated(engine, a), model.reference({1, 2, 3, 4, 5, 6, 7}, 8));
  EXPECT_EQ(Generated(engine, b), model.reference({8, 9, 10, 11, 12, 13, 14}, 8));
  EXPECT_GT(engine.stats().preemptions, 0);
  ExpectAllBlocksBack(engine);
}

TEST(Engine, AheadStepsLeaveOutStreamsTheHostMustSeeFirst) {
  Engine engine(SmallConfig());
  int64_t plain, last, chunked;
  ASSERT_TRUE(engine.enqueue({1, 2, 3}, MaxNew(8), &plain).ok());
  ASSERT_TRUE(engine.enqueue({7, 8, 9}, MaxNew(1), &last).ok());  // finishes with this token
  ASSERT_TRUE(engine.enqueue(std::vector<int32_t>(15, 5), MaxNew(8), &chunked).ok());  // budget 16: chunked
  const StepBatch& first = engine.schedule();
  ASSERT_EQ(first.num_streams, 3);
  ASSERT_EQ(first.num_sampled, 2);
  const StepBatch& ahead = engine.schedule_ahead();
  ASSERT_EQ(ahead.num_streams, 2);
  EXPECT_EQ(ahead.stream_ids[0], plain);  // on the placeholder of its first token
  EXPECT_EQ(ahead.token_ids[0], -1);
  EXPECT_EQ(ahead.positions[0], 3);
  EXPECT_EQ(ahead.num_generated[0], 1);
  EXPECT_EQ(ahead.stream_ids[1], chunked);  // the rest of its prompt: known tokens
  EXPECT_EQ(ahead.query_lens[1], 5);
  EXPECT_EQ(ahead.token_ids[1], 5);
  EXPECT_EQ(engine.schedule_ahead().num_streams, 0);  // two in flight: no third
  int32_t t1[2] = {42, 44};
  ASSERT_TRUE(engine.commit(t1, nullptr, 2).ok());
  int32_t t2[2] = {45, 46};
  ASSERT_TRUE(engine.commit(t2, nullptr, 2).ok());
  EXPECT_EQ(Generated(engine, plain), (std::vector<int32_t>{42, 45}));
  EXPECT_EQ(Generated(engine, chunked), (std::vector<int32_t>{46}));
  EXPECT_EQ(Generated(engine, last), (std::vector<int32_t>{44}));
}

TEST(Engine, WhileAStreamWithPenaltiesSamplesNothingRunsAhead) {
  Engine engine(SmallConfig());
  FakeModel model(24, 4);
  GenerateConfig penalized = MaxNew(6);
  penalized.repetition_penalty = 1.2f;
  int64_t plain, pen;
  ASSERT_TRUE(engine.enqueue({1, 2, 3}, MaxNew(6), &plain).ok());
  ASSERT_TRUE(engine.enqueue({4, 5, 6}, penalized, &pen).ok());
  EXPECT_EQ(RunOverlapped(engine, model), 0);  // the loop steps in turn, and both finish
  EXPECT_EQ(Generated(engine, plain), model.reference({1, 2, 3}, 6));
  EXPECT_EQ(Generated(engine, pen), model.reference({4, 5, 6}, 6));
  ExpectAllBlocksBack(engine);
}

TEST(Engine, OverlappedStepsStillEndATimedOutStream) {
  Engine engine(SmallConfig());
  FakeModel model(24, 4);
  const int64_t id = EnqueueTimingOut(engine);
  RunOverlapped(engine, model, [] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); });
  StreamUpdate u;
  ASSERT_TRUE(engine.poll(id, 0, &u));
  EXPECT_EQ(u.status, StreamStatus::ERROR);
  EXPECT_EQ(u.error.code, ErrorCode::GENERATE_TIMEOUT);
  EXPECT_LT(u.num_generated, 60);  // ended by the timeout, not by max_seq_len (64)
  ExpectAllBlocksBack(engine);
}

TEST(Engine, AFailureFailsBothStepsInFlightAndAReleaseWaitsForTheLast) {
  Engine engine(SmallConfig());
  FakeModel model(24, 4);
  int64_t a, b;
  ASSERT_TRUE(engine.enqueue({1, 2, 3}, MaxNew(6), &a).ok());
  ASSERT_TRUE(engine.enqueue({4, 5, 6}, MaxNew(6), &b).ok());
  auto out1 = model.run(engine.schedule());
  auto out2 = model.run(engine.schedule_ahead(), &out1);
  engine.release(a);  // in flight twice: cancelled at the first commit, freed after the second
  ASSERT_TRUE(engine.commit(out1.data(), nullptr, static_cast<int>(out1.size())).ok());
  StreamUpdate u;
  EXPECT_TRUE(engine.poll(a, 0, &u));  // still held by the step in flight
  EXPECT_GT(engine.stats().kv.used_blocks, 0);
  ASSERT_EQ(engine.schedule_ahead().num_streams, 1);  // b only
  ASSERT_TRUE(engine.fail_batch("injected failure").ok());  // fails the two in flight
  EXPECT_FALSE(engine.poll(a, 0, &u));
  ASSERT_TRUE(engine.poll(b, 0, &u));
  EXPECT_EQ(u.status, StreamStatus::ERROR);
  EXPECT_EQ(u.error.message, "injected failure");
  EXPECT_EQ(u.new_tokens, model.reference({4, 5, 6}, 1));  // the committed token stays
  ExpectAllBlocksBack(engine);
}

TEST(Engine, ListenersHearEveryUpdateAndWaitForWorkWakesUp) {
  Engine engine(SmallConfig());
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
