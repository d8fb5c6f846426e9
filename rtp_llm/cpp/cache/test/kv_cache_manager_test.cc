#include "rtp_llm/cpp/cache/kv_cache_manager.h"

#include <numeric>
#include <vector>

#include <gtest/gtest.h>

namespace rtp_llm {
namespace {

void ExpectAccounting(const KVCacheManager& kv) {
  const KVCacheStats s = kv.stats();
  EXPECT_EQ(s.free_blocks + s.used_blocks + s.cached_blocks, s.total_blocks);
}

std::vector<int32_t> Seq(int n, int start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// A stream that has computed all of `prompt`: its full blocks are published.
BlockTable Computed(KVCacheManager& kv, const std::vector<int32_t>& prompt) {
  BlockTable t;
  const int n = static_cast<int>(prompt.size());
  kv.grow(t, n);
  kv.publish_computed(t, prompt.data(), n);
  return t;
}

TEST(KVCacheManager, GrowsBlockByBlock) {
  KVCacheManager kv(8, 4, true);
  BlockTable t;
  ASSERT_TRUE(kv.can_grow(t, 5));
  kv.grow(t, 5);
  EXPECT_EQ(t.blocks.size(), 2u);
  kv.grow(t, 8);
  EXPECT_EQ(t.blocks.size(), 2u);
  kv.grow(t, 9);
  EXPECT_EQ(t.blocks.size(), 3u);
  EXPECT_FALSE(kv.can_grow(t, 8 * 4 + 1));
  kv.free(t);
  EXPECT_EQ(kv.stats().free_blocks, 8);
  ExpectAccounting(kv);
}

TEST(KVCacheManager, ReusesComputedPrefixAcrossStreams) {
  KVCacheManager kv(16, 4, true);
  auto prompt = Seq(10);
  BlockTable a = Computed(kv, prompt);  // blocks 0..1 are full and computed
  EXPECT_EQ(a.hashes.size(), 2u);

  auto other = prompt;
  other.push_back(99);
  PrefixMatch m = kv.match_prefix(other.data(), static_cast<int>(other.size()));
  ASSERT_EQ(m.blocks.size(), 2u);
  EXPECT_EQ(m.blocks[0], a.blocks[0]);
  EXPECT_EQ(m.num_unreferenced, 0);
  BlockTable b;
  ASSERT_TRUE(kv.can_allocate(b, m, 11));
  kv.allocate(b, m, 11);
  EXPECT_EQ(b.blocks[1], a.blocks[1]);
  EXPECT_NE(b.blocks[2], a.blocks[2]);
  EXPECT_EQ(kv.pool().ref_count(a.blocks[0]), 2);
  kv.free(a);
  kv.free(b);
  EXPECT_EQ(kv.stats().used_blocks, 0);
  ExpectAccounting(kv);
}

TEST(KVCacheManager, LeavesOneTokenToCompute) {
  KVCacheManager kv(8, 4, true);
  auto prompt = Seq(8);
  BlockTable a = Computed(kv, prompt);
  // The same 8-token prompt: only the first block may be reused, the last token is recomputed.
  EXPECT_EQ(kv.match_prefix(prompt.data(), 8).blocks.size(), 1u);
  kv.free(a);
}

TEST(KVCacheManager, CachedPrefixSurvivesUntilEvictedThenMisses) {
  KVCacheManager kv(4, 4, true);
  auto prompt = Seq(9);
  BlockTable a = Computed(kv, prompt);
  kv.free(a);  // two published blocks go to the LRU, the partial one to the free list
  EXPECT_EQ(kv.stats().cached_blocks, 2);
  ExpectAccounting(kv);

  PrefixMatch hit = kv.match_prefix(prompt.data(), 9);
  EXPECT_EQ(hit.blocks.size(), 2u);
  EXPECT_EQ(hit.num_unreferenced, 2);
  // Taking the hits uses capacity: 2 hits + 2 fresh blocks = all 4.
  BlockTable b;
  EXPECT_TRUE(kv.can_allocate(b, hit, 16));
  EXPECT_FALSE(kv.can_allocate(b, hit, 17));

  // Another prompt needing all 4 blocks evicts the cached prefix.
  auto unrelated = Seq(16, 1000);
  BlockTable c;
  ASSERT_TRUE(kv.can_grow(c, 16));
  kv.grow(c, 16);
  EXPECT_EQ(kv.stats().cached_blocks, 0);
  EXPECT_TRUE(kv.match_prefix(prompt.data(), 9).blocks.empty());
  kv.free(c);
  ExpectAccounting(kv);
}

TEST(KVCacheManager, DisabledPrefixCacheNeverMatches) {
  KVCacheManager kv(8, 4, false);
  auto prompt = Seq(9);
  BlockTable a = Computed(kv, prompt);
  EXPECT_TRUE(kv.match_prefix(prompt.data(), 9).blocks.empty());
  kv.free(a);
  EXPECT_EQ(kv.stats().free_blocks, 8);
}

}  // namespace
}  // namespace rtp_llm
