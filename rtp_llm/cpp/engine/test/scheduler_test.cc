#include "rtp_llm/cpp/engine/scheduler.h"

#include <memory>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "rtp_llm/cpp/engine/test/fake_model.h"

namespace rtp_llm {
namespace {

using testing::FakeModel;

// Drives a Scheduler directly (no EngineCore) with the fake model.
class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp(int num_blocks, int block_size, SchedulerConfig config, bool prefix_cache = true) {
    kv_ = std::make_unique<KVCacheManager>(num_blocks, block_size, prefix_cache);
    sched_ = std::make_unique<Scheduler>(config, *kv_, 1 << 20);
    model_ = std::make_unique<FakeModel>(num_blocks, block_size);
    batch_.reserve({config.max_batch_size, config.max_num_batched_tokens, num_blocks, 4096, 4096});
  }

  GenerateStream* Add(std::vector<int32_t> prompt, int max_new_tokens) {
    GenerateConfig c;
    c.max_new_tokens = max_new_tokens;
    const int64_t id = static_cast<int64_t>(streams_.size()) + 1;
    streams_.push_back(std::make_unique<GenerateStream>(id, std::move(prompt), c, 1 << 20, 0));
    sched_->add(streams_.back().get());
    return streams_.back().get();
  }

  // One step; returns the number of streams that ended.
  int Step() {
    sched_->schedule(batch_, ++now_);  // the step number stands in for the clock
    auto tokens = model_->run(batch_);
    std::vector<GenerateStream*> updated, ended;
    sched_->commit(batch_, tokens.data(), nullptr, {}, 0, updated, ended);
    ExpectAccounting();
    return static_cast<int>(ended.size());
  }

  void RunToCompletion() {
    for (int i = 0; i < 100000 && sched_->num_running() + sched_->num_waiting() > 0; ++i) Step();
    ASSERT_EQ(sched_->num_running() + sched_->num_waiting(), 0);
  }

  void ExpectAccounting() {
    const KVCacheStats s = kv_->stats();
    ASSERT_EQ(s.free_blocks + s.used_blocks + s.cached_blocks, s.total_blocks);
  }

  std::vector<int32_t> Generated(const GenerateStream* s) {
    return {s->tokens().begin() + s->prompt_len(), s->tokens().end()};
  }

  static std::vector<int32_t> Seq(int n, int start) {
    std::vector<int32_t> v(n);
    std::iota(v.begin(), v.end(), start);
    return v;
  }

  std::unique_ptr<KVCacheManager> kv_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<FakeModel> model_;
  std::vector<std::unique_ptr<GenerateStream>> streams_;
  StepBatch batch_;
  int64_t now_ = 0;
};

TEST_F(SchedulerTest, ChunkedPrefillRespectsTheTokenBudget) {
  SetUp(64, 4, {8, 10});
  auto* a = Add(Seq(25, 0), 3);
  auto* b = Add(Seq(7, 100), 3);
  std::vector<int> a_chunks;
  while (sched_->num_running() + sched_->num_waiting() > 0) {
    sched_->schedule(batch_, 0);
    EXPECT_LE(batch_.num_tokens, 10);
    EXPECT_EQ(batch_.query_starts[batch_.num_streams], batch_.num_tokens);
    for (int i = 0; i < batch_.num_streams; ++i) {
      if (batch_.stream_ids[i] == a->id() && batch_.prefix_lens[i] < a->prompt_len()) {
        a_chunks.push_back(batch_.query_lens[i]);
      }
    }
    auto tokens = model_->run(batch_);
    std::vector<GenerateStream*> updated, ended;
    sched_->commit(batch_, tokens.data(), nullptr, {}, 0, updated, ended);
  }
  EXPECT_EQ((std::vector<int>{10, 10, 5}), a_chunks);  // 25 prompt tokens in budget-sized chunks
  EXPECT_EQ(Generated(a), model_->reference(Seq(25, 0), 3));
  EXPECT_EQ(Generated(b), model_->reference(Seq(7, 100), 3));
}

TEST_F(SchedulerTest, DecodeStreamsGoFirstAndBatchSizeIsCapped) {
  SetUp(256, 4, {2, 64});
  for (int i = 0; i < 5; ++i) Add(Seq(3, 10 * i), 4);
  sched_->schedule(batch_, 0);
  EXPECT_EQ(batch_.num_streams, 2);
  EXPECT_EQ(batch_.stream_ids[0], 1);  // FIFO
  EXPECT_EQ(batch_.stream_ids[1], 2);
  auto tokens = model_->run(batch_);
  std::vector<GenerateStream*> updated, ended;
  sched_->commit(batch_, tokens.data(), nullptr, {}, 0, updated, ended);
  sched_->schedule(batch_, 0);
  EXPECT_EQ(batch_.stream_ids[0], 1);  // running streams before new ones
  EXPECT_EQ(batch_.query_lens[0], 1);
  EXPECT_EQ(batch_.num_prefill, 0);
  tokens = model_->run(batch_);
  sched_->commit(batch_, tokens.data(), nullptr, {}, 0, updated, ended);
  RunToCompletion();
  for (auto& s : streams_) EXPECT_EQ(Generated(s.get()), model_->reference(Seq(3, 10 * (s->id() - 1)), 4));
}

TEST_F(SchedulerTest, PrefixHitsCountAsComputed) {
  SetUp(64, 4, {8, 64});
  auto* first = Add(Seq(13, 0), 2);
  RunToCompletion();
  auto prompt = Seq(13, 0);
  prompt.push_back(777);
  auto* second = Add(prompt, 2);
  sched_->schedule(batch_, 0);
  // 13 computed tokens of `first` fill 3 blocks; the new prompt reuses all three.
  EXPECT_EQ(batch_.prefix_lens[0], 12);
  EXPECT_EQ(batch_.query_lens[0], 2);
  EXPECT_EQ(second->timing().reuse_len, 12);
  auto tokens = model_->run(batch_);
  std::vector<GenerateStream*> updated, ended;
  sched_->commit(batch_, tokens.data(), nullptr, {}, 0, updated, ended);
  RunToCompletion();
  EXPECT_EQ(Generated(second), model_->reference(prompt, 2));
  EXPECT_EQ(first->timing().reuse_len, 0);
  EXPECT_EQ(kv_->stats().hit_tokens, 12);
}

TEST_F(SchedulerTest, PreemptsLatestAdmittedAndResumesWithIdenticalTokens) {
  // 6 blocks of 4 tokens: three streams of 8-token prompts growing to 16 tokens cannot all fit.
  SetUp(6, 4, {8, 64});
  std::vector<GenerateStream*> s;
  for (int i = 0; i < 3; ++i) s.push_back(Add(Seq(8, 100 * i), 8));
  RunToCompletion();
  EXPECT_GT(sched_->num_preemptions(), 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Generated(s[i]), model_->reference(Seq(8, 100 * i), 8)) << "stream " << i;
    EXPECT_EQ(s[i]->status(), StreamStatus::FINISHED);
  }
  EXPECT_EQ(kv_->stats().used_blocks, 0);
}

TEST_F(SchedulerTest, PreemptionVictimIsTheMostRecentlyAdmitted) {
  SetUp(6, 2, {8, 64});  // 12 token slots; two streams growing to 9 tokens each cannot share
  auto* a = Add(Seq(3, 0), 6);
  auto* b = Add(Seq(3, 50), 6);
  Step();  // both admitted with 2 blocks each
  while (b->status() == StreamStatus::RUNNING) Step();
  EXPECT_EQ(a->status(), StreamStatus::RUNNING);
  EXPECT_EQ(b->status(), StreamStatus::WAITING);
  EXPECT_EQ(b->num_computed, 0);
  EXPECT_TRUE(b->block_table.blocks.empty());
  RunToCompletion();
  EXPECT_EQ(Generated(a), model_->reference(Seq(3, 0), 6));
  EXPECT_EQ(Generated(b), model_->reference(Seq(3, 50), 6));
}

TEST_F(SchedulerTest, WaitingQueueIsFifoEvenWhenALaterRequestWouldFit) {
  SetUp(4, 4, {8, 64});
  auto* running = Add(Seq(3, 900), 5);  // holds one block
  Step();
  auto* big = Add(Seq(15, 0), 1);   // needs all 4 blocks: waits for `running`
  auto* small = Add(Seq(3, 50), 1);  // would fit, but must not overtake `big`
  sched_->schedule(batch_, ++now_);
  EXPECT_EQ(batch_.num_streams, 1);
  EXPECT_EQ(batch_.stream_ids[0], running->id());
  auto tokens = model_->run(batch_);
  std::vector<GenerateStream*> updated, ended;
  sched_->commit(batch_, tokens.data(), nullptr, {}, 0, updated, ended);
  RunToCompletion();
  EXPECT_EQ(Generated(big), model_->reference(Seq(15, 0), 1));
  EXPECT_EQ(Generated(small), model_->reference(Seq(3, 50), 1));
  EXPECT_LE(big->timing().first_scheduled_us, small->timing().first_scheduled_us);
}

}  // namespace
}  // namespace rtp_llm
