// Speculative decoding's bookkeeping (scheduler.h): drafts count against the budget, commit
// keeps the accepted run plus one token, and rejected drafts leave no trace in num_computed, the
// block table or the prefix cache. The fake model's outputs equal its reference() only when
// every KV slot a step reads holds the right token, so a stale draft shows as a wrong token.
#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "rtp_llm/cpp/engine/drafter.h"
#include "rtp_llm/cpp/engine/scheduler.h"
#include "rtp_llm/cpp/engine/test/engine_core_test_util.h"
#include "rtp_llm/cpp/engine/test/fake_model.h"

namespace rtp_llm {
namespace {

using testing::FakeModel;

// Proposes the model's own continuation (all accepted), wrong from draft `wrong_at` on.
class OracleDrafter : public Drafter {
 public:
  OracleDrafter(const FakeModel& model, int wrong_at) : model_(model), wrong_at_(wrong_at) {}
  int propose(const int32_t* tokens, int n, int max_tokens, int32_t* out) const override {
    const std::vector<int32_t> next = model_.reference({tokens, tokens + n}, max_tokens);
    for (int j = 0; j < max_tokens; ++j) out[j] = j < wrong_at_ ? next[j] : (next[j] + 1) % model_.vocab();
    return max_tokens;
  }

 private:
  const FakeModel& model_;
  int wrong_at_;
};

// Always the same tokens (the hash model rejects them).
class FixedDrafter : public Drafter {
 public:
  int propose(const int32_t*, int, int max_tokens, int32_t* out) const override {
    for (int j = 0; j < max_tokens; ++j) out[j] = 990 + j;
    return max_tokens;
  }
};

class SpecTest : public ::testing::Test {
 protected:
  void SetUp(int num_blocks, int block_size, int budget, int max_drafts, std::unique_ptr<Drafter> drafter,
             bool prefix_cache = true, bool fixed_drafts = false) {
    kv_ = std::make_unique<KVCacheManager>(num_blocks, block_size, prefix_cache);
    budget_ = budget;
    drafter_ = std::move(drafter);
    SchedulerConfig config;
    config.max_batch_size = 8;
    config.max_num_batched_tokens = budget;
    config.max_drafts = max_drafts;
    config.fixed_drafts = fixed_drafts;
    sched_ = std::make_unique<Scheduler>(config, *kv_, 1 << 20, drafter_.get());
    batch_.reserve({8, budget, num_blocks, 4096, 4096});
  }

  GenerateStream* Add(std::vector<int32_t> prompt, GenerateConfig c) {
    const int64_t id = static_cast<int64_t>(streams_.size()) + 1;
    streams_.push_back(std::make_unique<GenerateStream>(id, std::move(prompt), c, 1 << 20, 0));
    sched_->add(streams_.back().get());
    return streams_.back().get();
  }

  // One step; checks the invariants rejected drafts must leave behind.
  void Step() {
    sched_->schedule(batch_, ++now_);
    ASSERT_LE(batch_.num_tokens, budget_);
    int drafts = 0;
    for (int i = 0; i < batch_.num_streams; ++i) {
      drafts += batch_.draft_lens[i];
      ASSERT_TRUE(batch_.draft_lens[i] == 0 || batch_.do_sample[i]);
    }
    ASSERT_EQ(drafts, batch_.num_draft_tokens);
    auto tokens = model_->run(batch_);
    ASSERT_EQ(static_cast<int>(tokens.size()), batch_.num_sampled + batch_.num_draft_tokens);
    appended_.assign(tokens.size(), -1);
    std::vector<GenerateStream*> updated, ended;
    sched_->commit(batch_, tokens.data(), nullptr, eos_, 0, updated, ended, appended_.data());
    const int bs = kv_->block_size();
    for (const GenerateStream* s : sched_->running()) {
      if (s->num_generated() == 0) continue;  // (a prompt chunk)
      // Nothing in flight: a decoding stream's last token is the only one not computed; it
      // holds no block past its tokens; only full blocks of computed tokens are published.
      EXPECT_EQ(s->num_computed, s->num_tokens() - 1);
      EXPECT_LE(static_cast<int>(s->block_table.blocks.size()), kv_->blocks_for(s->num_tokens()));
      EXPECT_LE(static_cast<int>(s->block_table.hashes.size()) * bs, s->num_computed);
    }
    const KVCacheStats st = kv_->stats();
    ASSERT_EQ(st.free_blocks + st.used_blocks + st.cached_blocks, st.total_blocks);
  }

  int RunToCompletion() {
    int steps = 0;
    for (; steps < 10000 && sched_->num_running() + sched_->num_waiting() > 0; ++steps) Step();
    EXPECT_EQ(sched_->num_running() + sched_->num_waiting(), 0);
    EXPECT_EQ(kv_->stats().used_blocks, 0);
    return steps;
  }

  static std::vector<int32_t> Generated(const GenerateStream* s) {
    return {s->tokens().begin() + s->prompt_len(), s->tokens().end()};
  }
  static GenerateConfig Greedy(int max_new_tokens) {
    GenerateConfig c;
    c.max_new_tokens = max_new_tokens;
    c.temperature = 0.0f;
    return c;
  }

  std::unique_ptr<KVCacheManager> kv_;
  std::unique_ptr<Drafter> drafter_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<FakeModel> model_ = std::make_unique<FakeModel>(64, 4);
  std::vector<std::unique_ptr<GenerateStream>> streams_;
  std::vector<int32_t> eos_, appended_;
  StepBatch batch_;
  int64_t now_ = 0;
  int budget_ = 0;
};

TEST_F(SpecTest, AcceptedDraftsGiveTheReferenceTextInFewerSteps) {
  SetUp(64, 4, 64, 4, std::make_unique<OracleDrafter>(*model_, 1 << 20));
  GenerateStream* s = Add({1, 2, 3, 4, 5}, Greedy(21));
  // One prefill step samples token 1; then each step keeps 4 drafts + 1: 20 tokens in 4 steps.
  EXPECT_EQ(RunToCompletion(), 5);
  EXPECT_EQ(Generated(s), model_->reference({1, 2, 3, 4, 5}, 21));
  EXPECT_EQ(s->spec().draft_rounds, 4);
  EXPECT_EQ(s->spec().accepted_per_pos, (std::vector<int32_t>{4, 4, 4, 4}));
  EXPECT_EQ(sched_->spec_stats().accepted_tokens, 16);
  EXPECT_EQ(s->timing().iter_count, 5);  // engine steps, as without drafts
}

TEST_F(SpecTest, CommitKeepsTheAcceptedRunAndTheTokenAfterIt) {
  SetUp(64, 4, 64, 4, std::make_unique<OracleDrafter>(*model_, 2));
  GenerateStream* s = Add({1, 2, 3, 4, 5}, Greedy(13));
  // Each verification keeps 2 drafts and the model's token after them: 3 tokens a step.
  EXPECT_EQ(RunToCompletion(), 5);
  EXPECT_EQ(Generated(s), model_->reference({1, 2, 3, 4, 5}, 13));
  EXPECT_EQ(s->spec().accepted_per_pos, (std::vector<int32_t>{4, 4, 0, 0}));
  // The first round drafts 4; after 2 were accepted the stream drafts 3 (DraftPace), and the
  // last round the 2 that are left: 4 + 3 + 3 + 2.
  EXPECT_EQ(sched_->spec_stats().draft_tokens, 12);
  EXPECT_EQ(sched_->spec_stats().accepted_tokens, 8);
}

TEST_F(SpecTest, AFixedPaceDraftsTheMostEveryRoundWhateverWasRejected) {
  for (bool fixed : {true, false}) {
    SetUp(64, 4, 256, 3, std::make_unique<FixedDrafter>(), true, fixed);
    Add({1, 2, 3, 4, 5}, Greedy(12));
    Step();  // the prompt
    std::vector<int> drafted;
    for (int i = 0; i < 4; ++i) {
      Step();
      drafted.push_back(batch_.draft_lens[0]);
    }
    // adaptive (DraftPace): 3 rejected -> 1 -> rejected at 1: a pause of one step -> 1
    EXPECT_EQ(drafted, fixed ? std::vector<int>({3, 3, 3, 3}) : std::vector<int>({3, 1, 0, 1})) << fixed;
    RunToCompletion();
  }
}

TEST_F(SpecTest, RejectedDraftsRollBackComputedPositionsAndBlocks) {
  SetUp(64, 4, 64, 4, std::make_unique<FixedDrafter>());
  GenerateStream* s = Add({1, 2, 3, 4, 5, 6, 7}, Greedy(9));
  EXPECT_EQ(RunToCompletion(), 9);  // every draft rejected: one token a step, as without
  EXPECT_EQ(Generated(s), model_->reference({1, 2, 3, 4, 5, 6, 7}, 9));
  // Decode steps 2..9 (the last has no room for drafts): 4 drafts rejected, then 1, then a
  // pause of 1 step, 1 draft, a pause of 2, 1 draft (DraftPace).
  EXPECT_EQ(sched_->spec_stats().draft_rounds, 4);
  EXPECT_EQ(sched_->spec_stats().draft_tokens, 7);
  EXPECT_EQ(sched_->spec_stats().accepted_tokens, 0);
}

TEST_F(SpecTest, NoBlockHoldingRejectedDraftsIsPublished) {
  SetUp(64, 4, 64, 4, std::make_unique<FixedDrafter>());
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  GenerateStream* a = Add(prompt, Greedy(8));
  // Step 2 verifies drafts 990..993 at positions 8..11: a whole block, rejected. Had it been
  // published, b (whose prompt has those drafts there) would reuse it after a's real tokens
  // overwrote it, and b's tokens would be wrong.
  RunToCompletion();
  std::vector<int32_t> b_prompt(a->tokens().begin(), a->tokens().begin() + 8);
  b_prompt.insert(b_prompt.end(), {990, 991, 992, 993, 5});
  const PrefixMatch match = kv_->match_prefix(b_prompt.data(), static_cast<int>(b_prompt.size()));
  EXPECT_EQ(match.blocks.size(), 2u);  // a's verified blocks only
  GenerateStream* b = Add(b_prompt, Greedy(4));
  RunToCompletion();
  EXPECT_EQ(Generated(b), model_->reference(b_prompt, 4));
}

TEST_F(SpecTest, DraftsCountAgainstTheStepBudget) {
  SetUp(64, 4, 6, 4, std::make_unique<OracleDrafter>(*model_, 1 << 20));
  GenerateStream* a = Add({1, 2, 3, 4, 5}, Greedy(12));
  GenerateStream* b = Add({6, 7, 8}, Greedy(12));
  bool squeezed = false;  // a step where a's drafts left b no room for its own
  for (int i = 0; i < 100 && sched_->num_running() + sched_->num_waiting() > 0; ++i) {
    Step();
    squeezed |= batch_.num_streams == 2 && batch_.num_tokens == 6 && batch_.draft_lens[0] == 4 &&
                batch_.draft_lens[1] == 0;
  }
  EXPECT_TRUE(squeezed);
  EXPECT_EQ(Generated(a), model_->reference({1, 2, 3, 4, 5}, 12));
  EXPECT_EQ(Generated(b), model_->reference({6, 7, 8}, 12));
}

TEST_F(SpecTest, AStopInsideAnAcceptedRunDropsTheTokensAfterIt) {
  SetUp(64, 4, 64, 6, std::make_unique<OracleDrafter>(*model_, 1 << 20));
  const std::vector<int32_t> ref = model_->reference({1, 2, 3}, 20);
  eos_ = {ref[3]};  // generated token 3 comes out of the first verification's accepted run
  ASSERT_EQ(std::find(ref.begin(), ref.begin() + 3, ref[3]), ref.begin() + 3);
  GenerateStream* s = Add({1, 2, 3}, Greedy(20));
  Step();  // prefill: token 0
  Step();  // tokens 1..7 verified; the stop at 3 keeps 1..3
  EXPECT_EQ(Generated(s), std::vector<int32_t>(ref.begin(), ref.begin() + 4));
  EXPECT_EQ(appended_, (std::vector<int32_t>{1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(s->finish_reason(), "stop");
  EXPECT_EQ(kv_->stats().used_blocks, 0);
}

TEST_F(SpecTest, DraftsStayWithinMaxNewTokens) {
  SetUp(64, 4, 64, 8, std::make_unique<OracleDrafter>(*model_, 1 << 20));
  GenerateStream* s = Add({1, 2, 3}, Greedy(5));
  Step();
  Step();
  EXPECT_EQ(batch_.draft_lens[0], 3);  // 1 token generated: 4 more at most, the last sampled
  EXPECT_EQ(Generated(s), model_->reference({1, 2, 3}, 5));
  EXPECT_EQ(s->finish_reason(), "length");
}

// Rows sampled at temperature > 0, penalized or biased draft too (rejection sampling verifies
// the sampled ones; the sampler gives each row the drafts before it in its penalty history);
// opted-out rows and rows with a thinking budget do not.
TEST_F(SpecTest, OnlyRowsWithoutPerTokenStateOrOptOutDraft) {
  SetUp(64, 4, 256, 4, std::make_unique<OracleDrafter>(*model_, 1 << 20));
  GenerateConfig sampled = Greedy(6), penalized = Greedy(6), opted_out = Greedy(6), biased = Greedy(6);
  GenerateConfig thinking = Greedy(6);
  sampled.temperature = 0.7f;
  penalized.repetition_penalty = 1.2f;
  opted_out.force_disable_sp_run = true;
  biased.logit_bias = {{3, 1.0f}};
  thinking.in_think_mode = true;
  thinking.max_thinking_tokens = 100;
  thinking.end_think_token_ids = {60};
  std::vector<GenerateStream*> drafting, not_drafting;
  for (const GenerateConfig& c : {opted_out, thinking}) not_drafting.push_back(Add({1, 2, 3}, c));
  for (const GenerateConfig& c : {Greedy(6), sampled, penalized, biased}) drafting.push_back(Add({1, 2, 3}, c));
  std::map<int64_t, int> drafted;  // stream id -> drafted tokens
  for (int i = 0; i < 20 && sched_->num_running() + sched_->num_waiting() > 0; ++i) {
    Step();
    for (int r = 0; r < batch_.num_streams; ++r) drafted[batch_.stream_ids[r]] += batch_.draft_lens[r];
  }
  for (const GenerateStream* s : drafting) EXPECT_GT(drafted[s->id()], 0) << s->id();
  for (const GenerateStream* s : not_drafting) EXPECT_EQ(drafted[s->id()], 0) << s->id();
}

TEST_F(SpecTest, ADraftingStreamIsPreemptedAndRecomputedExactly) {
  // 10 blocks of 4: two streams of 7-token prompts growing to 29 tokens cannot both fit.
  SetUp(10, 4, 64, 4, std::make_unique<OracleDrafter>(*model_, 3), /*prefix_cache=*/false);
  GenerateStream* a = Add({1, 2, 3, 4, 5, 6, 7}, Greedy(22));
  GenerateStream* b = Add({7, 6, 5, 4, 3, 2, 1}, Greedy(22));
  RunToCompletion();
  EXPECT_GT(sched_->num_preemptions(), 0);
  EXPECT_GT(a->spec().draft_rounds + b->spec().draft_rounds, 0);
  EXPECT_EQ(Generated(a), model_->reference({1, 2, 3, 4, 5, 6, 7}, 22));
  EXPECT_EQ(Generated(b), model_->reference({7, 6, 5, 4, 3, 2, 1}, 22));
}

// Through the EngineCore with its prompt-lookup drafter, on a repetitive model.
TEST(EngineCoreSpec, PromptLookupMatchesTheReferenceWithFewerStepsAlsoOverlapped) {
  for (const bool overlapped : {false, true}) {
    EngineCoreConfig c = testing::SmallConfig();
    c.gen_num_per_cycle = 4;
    c.max_num_batched_tokens = 32;
    EngineCore engine(c);
    FakeModel model(c.num_blocks, c.block_size, 1000, 5);
    const std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 11, 12, 13, 14, 15};
    GenerateConfig g = testing::MaxNew(30);
    g.temperature = 0.0f;
    int64_t a = 0, b = 0;
    ASSERT_TRUE(engine.enqueue(prompt, g, &a).ok());
    ASSERT_TRUE(engine.enqueue({21, 22, 23, 24, 25, 21, 22}, g, &b).ok());
    std::vector<int32_t> in_flight;
    bool have = false;
    for (int i = 0; i < 1000; ++i) {
      const StepBatch& next = overlapped ? engine.schedule_ahead() : engine.schedule();
      std::vector<int32_t> out;
      if (next.num_streams > 0) out = model.run(next, have ? &in_flight : nullptr);
      if (!overlapped && next.num_streams > 0) {
        ASSERT_TRUE(engine.commit(out.data(), nullptr, static_cast<int>(out.size())).ok());
        continue;
      }
      if (have) {
        ASSERT_TRUE(engine.commit(in_flight.data(), nullptr, static_cast<int>(in_flight.size())).ok());
      }
      if (next.num_streams == 0 && !have) break;
      in_flight = std::move(out);
      have = next.num_streams > 0;
    }
    EXPECT_EQ(testing::Generated(engine, a), model.reference(prompt, 30)) << overlapped;
    EXPECT_EQ(testing::Generated(engine, b), model.reference({21, 22, 23, 24, 25, 21, 22}, 30)) << overlapped;
    const EngineStats st = engine.stats();
    EXPECT_GT(st.spec.accepted_tokens, 0);
    EXPECT_LT(st.spec.accepted_tokens, st.spec.draft_tokens);  // every 7th position rejects
    EXPECT_LT(st.steps, 30) << overlapped;
    EXPECT_EQ(st.generated_tokens, 60);
    StreamUpdate u;
    ASSERT_TRUE(engine.poll(a, 0, &u));
    EXPECT_GT(u.spec.draft_rounds, 0);
    engine.release(a);
    engine.release(b);
    testing::ExpectAllBlocksBack(engine);
  }
}

// A draft model's drafts (draft_model = 1): the core reserves the positions, holding the last
// token; whoever runs the step writes the proposals over them before it runs (the model runner's
// draft model), and commit verifies what they hold then. Right proposals are accepted, wrong ones
// leave the reference text.
TEST(EngineCoreSpec, DeferredDraftsAreVerifiedAsFilledIn) {
  for (const int wrong_at : {1000, 2, 0}) {
    EngineCoreConfig c = testing::SmallConfig();
    c.gen_num_per_cycle = 3;
    c.draft_model = 1;
    c.max_num_batched_tokens = 32;
    EngineCore engine(c);
    FakeModel model(c.num_blocks, c.block_size, 1000, 0);
    const std::vector<int32_t> prompt = {11, 12, 13, 14, 15};
    GenerateConfig g = testing::MaxNew(24);
    g.temperature = 0.0f;
    int64_t a = 0;
    ASSERT_TRUE(engine.enqueue(prompt, g, &a).ok());
    int drafted_steps = 0;
    for (int i = 0; i < 200; ++i) {
      StepBatch& b = const_cast<StepBatch&>(engine.schedule());
      if (b.num_streams == 0) break;
      for (int s = 0; s < b.num_streams; ++s) {
        const int d = b.draft_lens[s];
        if (d == 0) continue;
        ++drafted_steps;
        int32_t* drafts = b.token_ids.data() + b.query_starts[s + 1] - d;
        for (int j = 0; j < d; ++j) EXPECT_EQ(drafts[j], drafts[-1]);  // reserved: the last token
        std::vector<int32_t> known;
        int prompt_len = 0;
        ASSERT_TRUE(engine.tokens(b.stream_ids[s], &known, &prompt_len));
        const std::vector<int32_t> next = model.reference(known, d);
        for (int j = 0; j < d; ++j) drafts[j] = j < wrong_at ? next[j] : (next[j] + 1) % 1000;
      }
      const std::vector<int32_t> out = model.run(b);
      ASSERT_TRUE(engine.commit(out.data(), nullptr, static_cast<int>(out.size())).ok());
    }
    EXPECT_EQ(testing::Generated(engine, a), model.reference(prompt, 24)) << wrong_at;
    const EngineStats st = engine.stats();
    EXPECT_GT(drafted_steps, 0);
    if (wrong_at >= 3) {
      EXPECT_EQ(st.spec.accepted_tokens, st.spec.draft_tokens);
      EXPECT_LE(st.steps, 1 + 24 / 4 + 1);
    } else if (wrong_at == 0) {
      EXPECT_EQ(st.spec.accepted_tokens, 0);
    } else {
      EXPECT_GT(st.spec.accepted_tokens, 0);
      EXPECT_LT(st.spec.accepted_tokens, st.spec.draft_tokens);
    }
    engine.release(a);
    testing::ExpectAllBlocksBack(engine);
  }
}

}  // namespace
}  // namespace rtp_llm
