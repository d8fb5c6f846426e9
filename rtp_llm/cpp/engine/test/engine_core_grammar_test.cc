// EngineCore with grammars: streams wait unadmitted until the host reports their grammar
// compiled, a failed compile ends only its stream, and commit says which tokens were kept.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "rtp_llm/cpp/engine/engine_core.h"
#include "rtp_llm/cpp/engine/test/engine_core_test_util.h"
#include "rtp_llm/cpp/engine/test/fake_model.h"

namespace rtp_llm {
namespace {

using namespace testing;  // NOLINT: FakeModel and the shared helpers

GenerateConfig WithGrammar(int max_new, const std::string& field, const std::string& spec) {
  GenerateConfig g = MaxNew(max_new);
  g.grammar.field = field;
  g.grammar.spec = spec;
  return g;
}

TEST(EngineCoreGrammar, AStreamWaitsForItsGrammarWhileOthersRun) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  int64_t constrained, plain;
  ASSERT_TRUE(engine.enqueue({1, 2, 3}, WithGrammar(3, "regex", "[a-z]+"), &constrained).ok());
  ASSERT_TRUE(engine.enqueue({4, 5}, MaxNew(3), &plain).ok());
  EXPECT_TRUE(engine.wait_for_work(0));  // a grammar to take, and a stream to run

  int64_t id = 0;
  std::string field, spec;
  ASSERT_TRUE(engine.next_grammar(&id, &field, &spec));
  EXPECT_EQ(id, constrained);
  EXPECT_EQ(field, "regex");
  EXPECT_EQ(spec, "[a-z]+");
  EXPECT_FALSE(engine.next_grammar(&id, &field, &spec));

  // Only the plain stream is admitted while the grammar compiles (it is behind it in FIFO).
  while (Step(engine, model)) {
  }
  EXPECT_EQ(Generated(engine, plain).size(), 3u);
  EXPECT_TRUE(Generated(engine, constrained).empty());
  EXPECT_FALSE(engine.wait_for_work(0));  // the waiting stream cannot run: the loop may sleep

  engine.grammar_done(constrained, {}, 1500, false);
  EXPECT_TRUE(engine.wait_for_work(0));
  const StepBatch& b = engine.schedule();
  ASSERT_EQ(b.num_streams, 1);
  EXPECT_EQ(b.stream_ids[0], constrained);
  EXPECT_EQ(b.grammar[0], 1);
  EXPECT_EQ(b.num_grammar, 1);
  auto tokens = model.run(b);
  ASSERT_TRUE(engine.commit(tokens.data(), nullptr, static_cast<int>(tokens.size())).ok());
  while (Step(engine, model)) {
  }
  EXPECT_EQ(Generated(engine, constrained), model.reference({1, 2, 3}, 3));

  std::vector<int64_t> ended;
  engine.take_ended_grammars(&ended);
  EXPECT_EQ(ended, std::vector<int64_t>{constrained});  // the plain stream is not reported
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.grammar.requests, 1);
  EXPECT_EQ(s.grammar.compiles, 1);
  EXPECT_EQ(s.grammar.compile_us, 1500);
  EXPECT_EQ(s.grammar.cache_hits, 0);
  ExpectAllBlocksBack(engine);
}

TEST(EngineCoreGrammar, AGrammarThatFailsEndsOnlyItsStreamNamingTheField) {
  EngineCore engine(SmallConfig());
  FakeModel model(24, 4);
  int64_t bad, good;
  ASSERT_TRUE(engine.enqueue({1, 2}, WithGrammar(2, "json_schema", "{\"type\": \"foo\"}"), &bad).ok());
  ASSERT_TRUE(engine.enqueue({1, 2}, WithGrammar(2, "json_schema", "{}"), &good).ok());
  engine.grammar_done(bad, invalid("json_schema", "json_schema does not compile: unsupported type"), 0, false);
  engine.grammar_done(good, {}, 0, true);
  StreamUpdate u;
  ASSERT_TRUE(engine.poll(bad, 0, &u));
  EXPECT_EQ(u.status, StreamStatus::ERROR);
  EXPECT_EQ(u.error.code, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(u.error.field, "json_schema");
  while (Step(engine, model)) {
  }
  EXPECT_EQ(Generated(engine, good).size(), 2u);
  std::vector<int64_t> ended;
  engine.take_ended_grammars(&ended);
  EXPECT_EQ(ended, (std::vector<int64_t>{bad, good}));
  EXPECT_EQ(engine.stats().grammar.failures, 1);
  EXPECT_EQ(engine.stats().grammar.cache_hits, 1);
  ExpectAllBlocksBack(engine);
}

TEST(EngineCoreGrammar, AStreamCancelledWhileItsGrammarCompilesIsNotHandedOut) {
  EngineCore engine(SmallConfig());
  int64_t id;
  ASSERT_TRUE(engine.enqueue({1, 2}, WithGrammar(2, "ebnf", "root ::= \"a\""), &id).ok());
  ASSERT_TRUE(engine.abort(id));
  int64_t got;
  std::string field, spec;
  EXPECT_FALSE(engine.next_grammar(&got, &field, &spec));
  engine.grammar_done(id, {}, 10, false);  // a compile that finishes late changes nothing
  StreamUpdate u;
  ASSERT_TRUE(engine.poll(id, 0, &u));
  EXPECT_EQ(u.status, StreamStatus::CANCELLED);
  std::vector<int64_t> ended;
  engine.take_ended_grammars(&ended);
  EXPECT_EQ(ended, std::vector<int64_t>{id});
  ExpectAllBlocksBack(engine);
}

TEST(EngineCoreGrammar, TwoGrammarFieldsAreRefusedNamingTheSecond) {
  EngineCore engine(SmallConfig());
  GenerateConfig g = WithGrammar(2, "json_schema", "{}");
  g.grammar.conflict = "regex";
  int64_t id;
  const ErrorInfo e = engine.enqueue({1}, g, &id);
  EXPECT_EQ(e.code, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(e.field, "regex");
  EXPECT_EQ(engine.enqueue({1}, WithGrammar(2, "regex", ""), &id).field, "regex");  // empty
}

// Overlap: a stream that stops at step N's commit still has a row in step N+1 (scheduled
// ahead); that row's token is dropped, and commit says so (a matcher must not see it).
TEST(EngineCoreGrammar, CommitSaysWhichTokensWereKept) {
  EngineCoreConfig c = SmallConfig();
  c.eos_token_ids = {7};
  EngineCore engine(c);
  int64_t a, b;
  ASSERT_TRUE(engine.enqueue({1, 2}, MaxNew(10), &a).ok());
  ASSERT_TRUE(engine.enqueue({3, 4}, MaxNew(10), &b).ok());
  const StepBatch& first = engine.schedule_ahead();
  ASSERT_EQ(first.num_sampled, 2);
  const StepBatch& second = engine.schedule_ahead();  // both again, on placeholders
  ASSERT_EQ(second.num_sampled, 2);
  int32_t appended[2] = {-1, -1};
  const int32_t t1[2] = {7, 5};  // a samples EOS: it stops at this commit
  ASSERT_TRUE(engine.commit(t1, nullptr, 2, appended).ok());
  EXPECT_EQ(appended[0], 1);
  EXPECT_EQ(appended[1], 1);
  const int32_t t2[2] = {8, 9};
  ASSERT_TRUE(engine.commit(t2, nullptr, 2, appended).ok());
  EXPECT_EQ(appended[0], 0);  // a's ahead row: a had ended
  EXPECT_EQ(appended[1], 1);
  EXPECT_EQ(Generated(engine, a), std::vector<int32_t>{7});
  EXPECT_EQ(Generated(engine, b), (std::vector<int32_t>{5, 9}));
}

}  // namespace
}  // namespace rtp_llm
