#include "rtp_llm/cpp/engine/generate_stream.h"

#include <gtest/gtest.h>

namespace rtp_llm {
namespace {

const std::vector<int32_t> kEos = {2};

GenerateStream Make(GenerateConfig c, int max_seq_len = 100) { return GenerateStream(1, {5, 6, 7}, c, max_seq_len, 0); }

// Appends `tokens` at times 1, 2, ...: only the last ends the stream, for `reason`.
void ExpectOnlyTheLastFinishes(GenerateStream& s, const std::vector<int32_t>& tokens, const char* reason) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(s.append(tokens[i], 0, kEos, static_cast<int64_t>(i + 1)), i + 1 == tokens.size()) << "token " << i;
  }
  EXPECT_EQ(s.status(), StreamStatus::FINISHED);
  EXPECT_EQ(s.finish_reason(), reason);
}

TEST(StopCriteria, MaxNewTokens) {
  GenerateConfig c;
  c.max_new_tokens = 2;
  auto s = Make(c);
  ExpectOnlyTheLastFinishes(s, {10, 11}, "length");
  EXPECT_EQ(s.num_generated(), 2);
}

TEST(StopCriteria, EosStopsUnlessIgnored) {
  GenerateConfig c;
  auto s = Make(c);
  EXPECT_TRUE(s.append(2, 0, kEos, 1));
  EXPECT_EQ(s.finish_reason(), "stop");

  c.ignore_eos = true;
  auto t = Make(c);
  EXPECT_FALSE(t.append(2, 0, kEos, 1));
}

TEST(StopCriteria, MinNewTokensDefersEosAndStopWords) {
  GenerateConfig c;
  c.min_new_tokens = 2;
  c.stop_words_list = {{9}};
  auto s = Make(c);
  EXPECT_FALSE(s.append(2, 0, kEos, 1));  // EOS before min_new_tokens is just a token
  EXPECT_TRUE(s.append(9, 0, kEos, 2));
  EXPECT_EQ(s.finish_reason(), "stop");
}

TEST(StopCriteria, StopWordSequenceMatchesOnlyGeneratedTokens) {
  GenerateConfig c;
  c.stop_words_list = {{7, 8}, {30, 31, 32}};
  auto s = Make(c);  // the prompt ends with 7: a stop word must not straddle it
  ExpectOnlyTheLastFinishes(s, {8, 30, 31, 32}, "stop");
}

TEST(StopCriteria, MaxSeqLen) {
  GenerateConfig c;
  c.max_new_tokens = 100;
  auto s = Make(c, 5);
  ExpectOnlyTheLastFinishes(s, {10, 11}, "length");
}

TEST(StopCriteria, Timeout) {
  GenerateConfig c;
  c.timeout_ms = 5;
  auto s = Make(c);
  EXPECT_FALSE(s.timed_out(4999));
  EXPECT_TRUE(s.timed_out(5001));
}

TEST(GenerateConfig, ValidationNamesTheField) {
  GenerateConfig c;
  EXPECT_TRUE(c.validate().ok());
  c.top_p = 0;
  EXPECT_NE(c.validate().message.find("top_p"), std::string::npos);
  c = {};
  c.max_new_tokens = 0;
  EXPECT_NE(c.validate().message.find("max_new_tokens"), std::string::npos);
  c = {};
  c.temperature = -1;
  EXPECT_EQ(c.validate().code, ErrorCode::INVALID_PARAMS);
  c = {};
  c.stop_words_list = {{}};
  EXPECT_NE(c.validate().message.find("stop_words_list"), std::string::npos);
}

TEST(GenerateStream, LogprobsKeptOnlyWhenAsked) {
  GenerateConfig c;
  auto s = Make(c);
  s.append(10, -0.5f, kEos, 1);
  EXPECT_TRUE(s.logprobs().empty());
  c.return_logprobs = true;
  auto t = Make(c);
  t.append(10, -0.5f, kEos, 1);
  ASSERT_EQ(t.logprobs().size(), 1u);
  EXPECT_FLOAT_EQ(t.logprobs()[0], -0.5f);
}

TEST(GenerateStream, KeepsItsOwnNumberOfAlternatives) {
  GenerateConfig c;
  c.top_logprobs = 2;
  auto s = Make(c);
  const int32_t ids[] = {10, 11, 12};  // the step's k (3) is the batch's largest
  const float lps[] = {-0.1f, -2.0f, -3.0f};
  s.append(SampledToken{10, -0.1f, ids, lps, 3}, kEos, 1);
  EXPECT_EQ(s.top_ids(), (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(s.top_logprobs(), (std::vector<float>{-0.1f, -2.0f}));
}

TEST(GenerateConfig, LogitBiasAndThinkingBudgetAreChecked) {
  GenerateConfig c;
  c.logit_bias = {{5, 100.0f}, {6, -100.0f}};
  EXPECT_TRUE(c.validate().ok());
  c.logit_bias = {{5, 100.5f}};
  EXPECT_EQ(c.validate().field, "logit_bias");
  c.logit_bias = {{-1, 1.0f}};
  EXPECT_EQ(c.validate().field, "logit_bias");
  c.logit_bias.assign(RTP_LLM_MAX_LOGIT_BIAS + 1, {1, 1.0f});
  EXPECT_EQ(c.validate().field, "logit_bias");
  c = {};
  c.top_logprobs = RTP_LLM_MAX_TOP_LOGPROBS + 1;
  EXPECT_EQ(c.validate().field, "top_logprobs");
  c = {};
  c.in_think_mode = true;
  c.max_thinking_tokens = 3;
  EXPECT_EQ(c.validate().field, "end_think_token_ids");
  c.max_thinking_tokens = -1;
  EXPECT_EQ(c.validate().field, "max_thinking_tokens");
}

GenerateConfig ThinkingBudget(int budget) {
  GenerateConfig c;
  c.in_think_mode = true;
  c.max_thinking_tokens = budget;
  c.end_think_token_ids = {90, 91};
  return c;
}

TEST(ThinkingBudget, ForcesTheEndTagOnceSpentThenNothing) {
  auto s = Make(ThinkingBudget(2));
  EXPECT_EQ(s.forced_token(), -1);
  EXPECT_TRUE(s.may_force_after_next() == false);
  s.append(10, 0, kEos, 1);
  EXPECT_TRUE(s.may_force_after_next());  // the sample after the next is past the budget
  s.append(11, 0, kEos, 2);
  EXPECT_EQ(s.forced_token(), 90);
  s.append(90, 0, kEos, 3);
  EXPECT_EQ(s.forced_token(), 91);
  s.append(91, 0, kEos, 4);
  EXPECT_EQ(s.forced_token(), -1);  // thinking closed: the answer is free
  EXPECT_FALSE(s.may_force_after_next());
}

TEST(ThinkingBudget, ThinkingClosedByTheModelIsNotForced) {
  auto s = Make(ThinkingBudget(3));
  for (int32_t t : {90, 91, 12, 13}) s.append(t, 0, kEos, 1);
  EXPECT_EQ(s.forced_token(), -1);
  auto t = Make(ThinkingBudget(3));
  for (int32_t tok : {90, 12, 90}) t.append(tok, 0, kEos, 1);  // a broken tag restarts the match
  EXPECT_EQ(t.forced_token(), 91);
  GenerateConfig off = ThinkingBudget(1);
  off.in_think_mode = false;
  auto u = Make(off);
  u.append(10, 0, kEos, 1);
  EXPECT_EQ(u.forced_token(), -1);
}

}  // namespace
}  // namespace rtp_llm
