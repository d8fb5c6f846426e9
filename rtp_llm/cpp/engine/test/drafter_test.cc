#include "rtp_llm/cpp/engine/drafter.h"

#include <vector>

#include <gtest/gtest.h>

namespace rtp_llm {
namespace {

std::vector<int32_t> Propose(const NgramDrafter& d, const std::vector<int32_t>& tokens, int max_tokens) {
  std::vector<int32_t> out(max_tokens, -7);
  out.resize(d.propose(tokens.data(), static_cast<int>(tokens.size()), max_tokens, out.data()));
  return out;
}

TEST(NgramDrafter, ProposesWhatFollowedTheLatestEarlierOccurrence) {
  const NgramDrafter d(2, 3);
  // "4 5" occurs at 1 (followed by 6 7) and at 5 (followed by 8 9): the latest wins.
  EXPECT_EQ(Propose(d, {1, 4, 5, 6, 7, 4, 5, 8, 9, 2, 4, 5}, 2), (std::vector<int32_t>{8, 9}));
}

TEST(NgramDrafter, TheLongestMatchingSuffixWins) {
  const NgramDrafter d(1, 3);
  // "3 4 5" matches at 2 (followed by 6); "4 5" alone would match later at 8 (followed by 9).
  EXPECT_EQ(Propose(d, {1, 2, 3, 4, 5, 6, 0, 0, 4, 5, 9, 3, 4, 5}, 1), (std::vector<int32_t>{6}));
  // With max 2, the 2-gram's latest occurrence is taken.
  EXPECT_EQ(Propose(NgramDrafter(1, 2), {1, 2, 3, 4, 5, 6, 0, 0, 4, 5, 9, 3, 4, 5}, 1), (std::vector<int32_t>{9}));
}

TEST(NgramDrafter, StopsAtMaxTokensAndAtTheLastToken) {
  const NgramDrafter d(2, 2);
  EXPECT_EQ(Propose(d, {1, 2, 3, 4, 5, 1, 2}, 3), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(Propose(d, {1, 2, 3, 4, 5, 1, 2}, 9), (std::vector<int32_t>{3, 4, 5, 1, 2}));
  // A copy may run into the suffix itself: "7 7" after "7 7" proposes the rest of the run.
  EXPECT_EQ(Propose(d, {7, 7, 7}, 4), (std::vector<int32_t>{7}));
}

TEST(NgramDrafter, ShorterThanMinMatchOrNoMatchProposesNothing) {
  const NgramDrafter d(2, 3);
  EXPECT_TRUE(Propose(d, {1, 2, 3, 4, 5}, 4).empty());   // no repeated 2-gram
  EXPECT_TRUE(Propose(d, {1, 2, 3, 1}, 4).empty());      // "1" repeats, but 1-grams are below min
  EXPECT_EQ(Propose(NgramDrafter(1, 3), {1, 2, 3, 1}, 4), (std::vector<int32_t>{2, 3, 1}));
  EXPECT_TRUE(Propose(d, {5}, 4).empty());
  EXPECT_TRUE(Propose(d, {1, 2, 1, 2}, 0).empty());
}

}  // namespace
}  // namespace rtp_llm
