// EngineCore with overlapped steps: each batch scheduled ahead of the previous one's tokens.
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

// Drives the engine as an overlapping model runner does: each batch is scheduled ahead of
// the previous one's tokens and run (on the device, in order) before that one commits.
// Returns how many batches ran on placeholders.
int RunOverlapped(EngineCore& engine, FakeModel& model, const std::function<void()>& between_steps = {}) {
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

TEST(EngineCore, OverlappedStepsMatchTheReferenceUnderPressureWithStopsAndCancels) {
  EngineCoreConfig c = SmallConfig();
  for (int32_t t = 3; t < 1000; t += 37) c.eos_token_ids.push_back(t);  // ~3% of tokens stop a stream
  EngineCore engine(c);
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

TEST(EngineCore, OverlappedStepsFallBackToARegularStepThatPreempts) {
  EngineCoreConfig c = SmallConfig();
  c.num_blocks = 5;  // two streams of 7 prompt tokens both need a third block at position 8
  EngineCore engine(c);
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

TEST(EngineCore, AheadStepsLeaveOutStreamsTheHostMustSeeFirst) {
  EngineCore engine(SmallConfig());
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

// Enqueues a plain stream ({1, 2, 3}) and one with `penalized`'s penalties on `prompt`, both
// of 6 new tokens.
std::pair<int64_t, int64_t> EnqueuePlainAndPenalized(EngineCore& engine, const std::vector<int32_t>& prompt,
                                                     GenerateConfig penalized) {
  penalized.max_new_tokens = 6;
  int64_t plain = 0, pen = 0;
  EXPECT_TRUE(engine.enqueue({1, 2, 3}, MaxNew(6), &plain).ok());
  EXPECT_TRUE(engine.enqueue(prompt, penalized, &pen).ok());
  return {plain, pen};
}

TEST(EngineCore, WhileAStreamWithPenaltiesSamplesNothingRunsAhead) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  GenerateConfig penalized;
  penalized.repetition_penalty = 1.2f;
  const auto [plain, pen] = EnqueuePlainAndPenalized(engine, {4, 5, 6}, penalized);
  EXPECT_EQ(RunOverlapped(engine, model), 0);  // the loop steps in turn, and both finish
  EXPECT_EQ(Generated(engine, plain), model.reference({1, 2, 3}, 6));
  EXPECT_EQ(Generated(engine, pen), model.reference({4, 5, 6}, 6));
  ExpectAllBlocksBack(engine);
}

TEST(EngineCore, PenalizedRowsCarryTheirWholeHistoryInTheStep) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  GenerateConfig penalized;
  penalized.presence_penalty = 0.5f;
  EnqueuePlainAndPenalized(engine, {4, 5, 6, 7}, penalized);
  std::vector<int32_t> expected = {4, 5, 6, 7};
  for (int step = 0; step < 3; ++step) {
    const StepBatch& b = engine.schedule();
    ASSERT_EQ(b.num_streams, 2);
    EXPECT_EQ(b.history_lens[0], 0);  // no penalties: nothing copied
    ASSERT_EQ(b.history_lens[1], static_cast<int>(expected.size()));
    EXPECT_EQ(b.num_history_tokens, b.history_lens[1]);
    const int32_t* h = b.history_tokens.data() + b.history_starts[1];
    EXPECT_EQ(std::vector<int32_t>(h, h + b.history_lens[1]), expected);
    EXPECT_EQ(b.num_generated[1], step);  // the generated tail of the history
    auto tokens = model.run(b);
    ASSERT_TRUE(engine.commit(tokens.data(), nullptr, static_cast<int>(tokens.size())).ok());
    expected.push_back(tokens[1]);
  }
}

TEST(EngineCore, SampledRowsCarryTheirLogitBiasEvenAhead) {
  EngineCore engine(SmallConfig());
  GenerateConfig biased = MaxNew(4);
  biased.logit_bias = {{7, 1.5f}, {9, -100.0f}};
  int64_t plain, with_bias;
  ASSERT_TRUE(engine.enqueue({1, 2, 3}, MaxNew(4), &plain).ok());
  ASSERT_TRUE(engine.enqueue({4, 5, 6}, biased, &with_bias).ok());
  const StepBatch& first = engine.schedule();
  const StepBatch& ahead = engine.schedule_ahead();  // a bias needs no history: it runs ahead
  for (const StepBatch* b : {&first, &ahead}) {
    ASSERT_EQ(b->num_streams, 2);
    EXPECT_EQ(b->bias_lens[0], 0);
    ASSERT_EQ(b->bias_lens[1], 2);
    EXPECT_EQ(b->num_bias_entries, 2);
    const int j = b->bias_starts[1];
    EXPECT_EQ(std::vector<int32_t>(b->bias_tokens.begin() + j, b->bias_tokens.begin() + j + 2),
              (std::vector<int32_t>{7, 9}));
    EXPECT_EQ(b->bias_values[j + 1], -100.0f);
    EXPECT_EQ(b->forced_tokens[0], -1);
  }
}

TEST(EngineCore, AThinkingBudgetForcesTheEndTagAndHoldsItsStreamBack) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  GenerateConfig g = MaxNew(6);
  g.in_think_mode = true;
  g.max_thinking_tokens = 2;
  g.end_think_token_ids = {20, 21};
  int64_t id;
  ASSERT_TRUE(engine.enqueue({1, 2, 3}, g, &id).ok());
  // Overlapped driving; the model obeys forced_tokens as the sampler does.
  std::vector<int32_t> in_flight;
  std::vector<int> forced_rows;  // the generated index each forced row samples
  bool have = false;
  for (int i = 0; i < 100; ++i) {
    const StepBatch& next = engine.schedule_ahead();
    const bool ran = next.num_streams > 0;
    std::vector<int32_t> out;
    if (ran) {
      out = model.run(next, have ? &in_flight : nullptr);
      if (next.forced_tokens[0] >= 0) {
        EXPECT_GE(next.token_ids[0], 0);  // never on a placeholder: its state was exact
        out[0] = next.forced_tokens[0];
        forced_rows.push_back(next.num_generated[0]);
      }
    }
    if (have) {
      ASSERT_TRUE(engine.commit(in_flight.data(), nullptr, static_cast<int>(in_flight.size())).ok());
    }
    if (!ran && !have) break;
    in_flight = std::move(out);
    have = ran;
  }
  const auto tokens = Generated(engine, id);
  ASSERT_EQ(tokens.size(), 6u);
  EXPECT_EQ(tokens[2], 20);
  EXPECT_EQ(tokens[3], 21);
  EXPECT_EQ(forced_rows, (std::vector<int>{2, 3}));
}

TEST(EngineCore, OverlappedStepsStillEndATimedOutStream) {
  EngineCore engine(SmallConfig());
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

TEST(EngineCore, AFailureFailsBothStepsInFlightAndAReleaseWaitsForTheLast) {
  EngineCore engine(SmallConfig());
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
}  // namespace
}  // namespace rtp_llm
