// Prompt log-probs (GenerateConfig::prompt_logprobs): the step batch's prompt_targets rows, their
// recording at commit and their delivery, against the fake model's oracle: every row's value is
// computed from its context read back through the block table, so a wrong target, a chunk
// boundary off by one, a prefix-cache hit or a recomputed row recorded twice shows.
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "rtp_llm/cpp/engine/engine_core.h"
#include "rtp_llm/cpp/engine/test/engine_core_test_util.h"
#include "rtp_llm/cpp/engine/test/fake_model.h"

namespace rtp_llm {
namespace {

using namespace testing;  // NOLINT: FakeModel and the shared helpers

constexpr int32_t kAlt0 = 7, kAlt1 = 8;  // the alternatives every prompt row reports (k <= 2)

GenerateConfig WithPromptLogprobs(int max_new, int k) {
  GenerateConfig g = MaxNew(max_new);
  g.ignore_eos = true;
  g.prompt_logprobs = k;
  return g;
}

// Runs `b` with the fake model and commits its samples and prompt rows (alternatives kAlt0,
// kAlt1 with the row's value and the value - 1). Adds the step's prompt rows to *rows (may be null).
void RunAndCommit(EngineCore& engine, FakeModel& model, const StepBatch& b, int64_t* rows = nullptr) {
  std::vector<int32_t> tokens = model.run(b);
  std::vector<float> lps = model.prompt_rows(b);
  EXPECT_EQ(static_cast<int>(lps.size()), b.num_prompt_logprobs);
  std::vector<int32_t> ids;
  std::vector<float> top;
  for (float lp : lps) {
    ids.insert(ids.end(), {kAlt0, kAlt1});
    top.insert(top.end(), {lp, lp - 1.0f});
  }
  StepSamples s{tokens.data(), nullptr, nullptr, nullptr, 0, lps.data(), ids.data(), top.data(), 2,
                static_cast<int>(lps.size())};
  EXPECT_TRUE(engine.commit(s, static_cast<int>(tokens.size())).ok());
  if (rows != nullptr) *rows += static_cast<int64_t>(lps.size());
}

bool PromptStep(EngineCore& engine, FakeModel& model, int64_t* rows = nullptr) {
  const StepBatch& b = engine.schedule();
  if (b.num_streams == 0) return false;
  RunAndCommit(engine, model, b, rows);
  return true;
}

void ExpectPromptLogprobs(EngineCore& engine, int64_t id, const FakeModel& model, const std::vector<int32_t>& prompt,
                          int k) {
  StreamUpdate u;
  ASSERT_TRUE(engine.poll(id, 0, &u));
  const std::vector<float> want = model.reference_prompt(prompt);
  EXPECT_EQ(u.prompt_logprobs, want) << "stream " << id;
  EXPECT_EQ(u.prompt_top_logprobs, k);
  ASSERT_EQ(u.prompt_top_ids.size(), want.size() * k);
  for (size_t q = 0; q < want.size(); ++q) {
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(u.prompt_top_ids[q * k + j], j == 0 ? kAlt0 : kAlt1);
      EXPECT_EQ(u.prompt_top_lps[q * k + j], want[q] - static_cast<float>(j));
    }
  }
  // Delivered once: a reader past the first output gets none.
  ASSERT_TRUE(engine.poll(id, 1, &u));
  EXPECT_TRUE(u.prompt_logprobs.empty());
  EXPECT_TRUE(u.prompt_top_ids.empty());
}

TEST(PromptLogprobs, ChunkedPrefillYieldsEachChunksRowsAcrossTheBoundary) {
  EngineCore engine(SmallConfig());  // 16 tokens a step: a 30-token prompt runs in two chunks
  FakeModel model(24, 4);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back(100 + 3 * i);
  int64_t id;
  ASSERT_TRUE(engine.enqueue(prompt, WithPromptLogprobs(3, 2), &id).ok());

  const StepBatch& first = engine.schedule();
  ASSERT_EQ(first.num_tokens, 16);
  EXPECT_EQ(first.num_prompt_logprobs, 16);  // positions 0..15: targets prompt[1..16]
  for (int t = 0; t < 16; ++t) EXPECT_EQ(first.prompt_targets[t], prompt[t + 1]) << t;
  RunAndCommit(engine, model, first);  // (nothing sampled: a chunk)

  const StepBatch& second = engine.schedule();
  ASSERT_EQ(second.num_tokens, 14);  // positions 16..29; 29's next token is sampled
  EXPECT_EQ(second.num_prompt_logprobs, 13);
  EXPECT_EQ(second.prompt_targets[0], prompt[17]);  // the boundary: the chunk's first row
  EXPECT_EQ(second.prompt_targets[13], -1);
  RunAndCommit(engine, model, second);
  int64_t rows = 0;
  while (PromptStep(engine, model, &rows)) {
  }
  EXPECT_EQ(rows, 0);  // decode steps carry no prompt rows
  ExpectPromptLogprobs(engine, id, model, prompt, 2);
  EXPECT_EQ(Generated(engine, id), model.reference(prompt, 3));
  ExpectAllBlocksBack(engine);
}

TEST(PromptLogprobs, TheirRowsKeepToTheirOwnBudgetBesideTheSteps) {
  EngineCoreConfig c = SmallConfig();
  c.num_blocks = 256;
  c.block_size = 16;
  c.max_num_batched_tokens = 2048;
  c.max_seq_len = 2048;
  EngineCore engine(c);
  FakeModel model(c.num_blocks, c.block_size);
  const int cap = SchedulerConfig{}.max_prompt_rows;
  std::vector<int32_t> scored, plain;
  for (int i = 0; i < 1300; ++i) scored.push_back(1 + i % 400);
  for (int i = 0; i < 700; ++i) plain.push_back(2 + i % 300);
  int64_t a, b, d;
  ASSERT_TRUE(engine.enqueue(scored, WithPromptLogprobs(2, 1), &a).ok());
  ASSERT_TRUE(engine.enqueue(scored, WithPromptLogprobs(2, 1), &b).ok());
  ASSERT_TRUE(engine.enqueue(plain, MaxNew(2), &d).ok());

  const StepBatch& first = engine.schedule();  // a takes the rows' budget; b waits; the plain prompt runs
  ASSERT_EQ(first.num_streams, 2);
  EXPECT_EQ(first.query_lens[0], cap);
  EXPECT_EQ(first.num_prompt_logprobs, cap);
  EXPECT_EQ(first.query_lens[1], 700);
  RunAndCommit(engine, model, first);
  int steps = 1;
  for (;;) {
    const StepBatch& s = engine.schedule();
    if (s.num_streams == 0) break;
    EXPECT_LE(s.num_prompt_logprobs, cap);
    RunAndCommit(engine, model, s);
    ++steps;
  }
  EXPECT_GE(steps, 2 * 1300 / cap);
  ExpectPromptLogprobs(engine, a, model, scored, 1);
  ExpectPromptLogprobs(engine, b, model, scored, 1);
  EXPECT_EQ(Generated(engine, a), model.reference(scored, 2));
  EXPECT_EQ(Generated(engine, d), model.reference(plain, 2));
  ExpectAllBlocksBack(engine);
}

TEST(PromptLogprobs, CommitMustCarryEveryPromptRow) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  int64_t id;
  ASSERT_TRUE(engine.enqueue({1, 2, 3, 4}, WithPromptLogprobs(1, 0), &id).ok());
  const StepBatch& b = engine.schedule();
  ASSERT_EQ(b.num_prompt_logprobs, 3);
  std::vector<int32_t> tokens = model.run(b);
  EXPECT_FALSE(engine.commit(tokens.data(), nullptr, 1).ok());  // no prompt rows: refused
  std::vector<float> lps = model.prompt_rows(b);
  ASSERT_TRUE(engine.commit({tokens.data(), nullptr, nullptr, nullptr, 0, lps.data(), nullptr, nullptr, 0, 3}, 1).ok());
  ExpectPromptLogprobs(engine, id, model, {1, 2, 3, 4}, 0);
}

TEST(PromptLogprobs, StreamRunsItsWholePromptButStillPublishesItsBlocks) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};  // 3 full blocks + 1
  int64_t a, b, c;
  ASSERT_TRUE(engine.enqueue(prompt, MaxNew(2), &a).ok());
  while (PromptStep(engine, model)) {
  }
  const int64_t hits = engine.stats().kv.hit_tokens;

  ASSERT_TRUE(engine.enqueue(prompt, WithPromptLogprobs(2, 1), &b).ok());
  const StepBatch& first = engine.schedule();
  EXPECT_EQ(first.prefix_lens[0], 0);  // the cached 12 tokens are not reused
  EXPECT_EQ(first.query_lens[0], 13);
  int64_t rows = 0;
  RunAndCommit(engine, model, first, &rows);
  while (PromptStep(engine, model, &rows)) {
  }
  EXPECT_EQ(rows, 12);
  EXPECT_EQ(engine.stats().kv.hit_tokens, hits);
  ExpectPromptLogprobs(engine, b, model, prompt, 1);
  StreamUpdate u;
  ASSERT_TRUE(engine.poll(b, 0, &u));
  EXPECT_EQ(u.timing.reuse_len, 0);

  ASSERT_TRUE(engine.enqueue(prompt, MaxNew(2), &c).ok());  // a plain stream reuses them
  while (PromptStep(engine, model)) {
  }
  EXPECT_EQ(engine.stats().kv.hit_tokens, hits + 12);
  EXPECT_EQ(Generated(engine, c), model.reference(prompt, 2));
}

TEST(PromptLogprobs, PreemptionRecomputesWithoutRecordingARowTwice) {
  EngineCore engine(SmallConfig());  // 24 blocks of 4: too few for everyone at once
  FakeModel model(24, 4);
  std::mt19937 rng(11);
  const std::vector<int32_t> system_prompt = {21, 22, 23, 24, 25, 26, 27, 28};
  struct Request {
    int64_t id;
    std::vector<int32_t> prompt;
    bool prompt_logprobs;
  };
  std::vector<Request> requests;
  int64_t want_rows = 0, rows = 0;
  for (int i = 0; i < 30; ++i) {
    std::vector<int32_t> prompt = i % 3 ? system_prompt : std::vector<int32_t>{};
    const int extra = 1 + static_cast<int>(rng() % 20);
    for (int j = 0; j < extra; ++j) prompt.push_back(static_cast<int32_t>(rng() % 500));
    const bool plp = i % 2 == 0;
    const int max_new = 1 + static_cast<int>(rng() % 24);
    int64_t id;
    ASSERT_TRUE(engine.enqueue(prompt, plp ? WithPromptLogprobs(max_new, 2) : MaxNew(max_new), &id).ok());
    if (plp) want_rows += static_cast<int64_t>(prompt.size()) - 1;
    requests.push_back({id, prompt, plp});
    if (i % 4 == 0) PromptStep(engine, model, &rows);
  }
  while (PromptStep(engine, model, &rows)) {
  }
  EXPECT_GT(engine.stats().preemptions, 0);
  EXPECT_EQ(rows, want_rows);  // no prompt row ran twice
  for (const Request& r : requests) {
    StreamUpdate u;
    ASSERT_TRUE(engine.poll(r.id, 0, &u));
    EXPECT_EQ(u.new_tokens, model.reference(r.prompt, u.num_generated)) << "stream " << r.id;
    if (r.prompt_logprobs) {
      ExpectPromptLogprobs(engine, r.id, model, r.prompt, 2);
    } else {
      EXPECT_TRUE(u.prompt_logprobs.empty());
    }
  }
  ExpectAllBlocksBack(engine);
}

}  // namespace
}  // namespace rtp_llm
