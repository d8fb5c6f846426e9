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

TEST(DraftPace, AcceptedRoundsKeepOrRaiseTheAllowanceRejectedOnesLowerIt) {
  DraftPace p;
  EXPECT_EQ(p.allowance(8), 8);  // nothing verified yet: all it may
  p.record(8, 3, 8);             // 3 of 8: the accepted run and one more
  EXPECT_EQ(p.allowance(8), 4);
  p.record(4, 4, 8);  // all accepted: doubled
  EXPECT_EQ(p.allowance(8), 8);
  p.record(2, 2, 8);  // all accepted, but max_drafts caps it
  EXPECT_EQ(p.allowance(8), 8);
  p.record(8, 0, 8);  // none of 8: one next time, not a pause yet
  EXPECT_EQ(p.allowance(8), 1);
  EXPECT_EQ(p.allowance(3), 1);
}

TEST(DraftPace, RejectedSingleDraftsPauseDraftingLongerEachTimeUntilOneIsAccepted) {
  DraftPace p;
  p.record(4, 0, 4);
  EXPECT_EQ(p.allowance(4), 1);
  std::vector<int> pauses;
  for (int round = 0; round < 6; ++round) {
    p.record(1, 0, 4);  // its single draft rejected
    int paused = 0;
    while (p.allowance(4) == 0) ++paused;  // (the call that returns 1 is the next round's)
    pauses.push_back(paused);
  }
  EXPECT_EQ(pauses, (std::vector<int>{1, 2, 4, 8, DraftPace::kMaxBackoff, DraftPace::kMaxBackoff}));
  p.record(1, 1, 4);  // accepted: no pause, and the allowance doubles
  EXPECT_EQ(p.allowance(4), 2);
  p.record(2, 0, 4);
  EXPECT_EQ(p.allowance(4), 1);
  p.record(1, 0, 4);  // the next pause starts from 1 again
  EXPECT_EQ(p.allowance(4), 0);
  EXPECT_EQ(p.allowance(4), 1);
}

}  // namespace
}  // namespace rtp_llm
