#include "rtp_llm/cpp/cache/block_pool.h"

#include <vector>

#include <gtest/gtest.h>

namespace rtp_llm {
namespace {

void ExpectAccounting(const BlockPool& pool) {
  EXPECT_EQ(pool.num_free() + pool.num_used() + pool.num_cached(), pool.num_blocks());
}

std::vector<int32_t> Tokens(int block_size, int seed) {
  std::vector<int32_t> t(block_size);
  for (int i = 0; i < block_size; ++i) t[i] = seed * 100 + i;
  return t;
}

// A fresh block holding `tokens` (a first block: parent hash 0), published.
int Published(BlockPool& pool, const std::vector<int32_t>& tokens) {
  const int b = pool.allocate();
  pool.publish(b, hash_block(0, tokens.data(), static_cast<int>(tokens.size())), tokens.data());
  return b;
}

TEST(BlockPool, RunningOutIsAnAnswer) {
  BlockPool pool(3, 4);
  EXPECT_TRUE(pool.can_allocate(3));
  EXPECT_FALSE(pool.can_allocate(4));
  std::vector<int> got{pool.allocate(), pool.allocate(), pool.allocate()};
  EXPECT_FALSE(pool.can_allocate(1));
  EXPECT_EQ(pool.num_used(), 3);
  ExpectAccounting(pool);
  for (int b : got) pool.unref(b);
  EXPECT_EQ(pool.num_free(), 3);
  ExpectAccounting(pool);
}

TEST(BlockPool, PublishedBlocksAreSharedAndCachedWhenUnreferenced) {
  BlockPool pool(4, 4);
  auto tokens = Tokens(4, 1);
  const uint64_t h = hash_block(0, tokens.data(), 4);
  const int b = Published(pool, tokens);
  EXPECT_EQ(pool.lookup(h, tokens.data()), b);
  pool.ref(b);  // a second stream hits it
  EXPECT_EQ(pool.ref_count(b), 2);
  pool.unref(b);
  pool.unref(b);
  EXPECT_TRUE(pool.is_cached(b));
  EXPECT_EQ(pool.num_cached(), 1);
  EXPECT_EQ(pool.num_available(), 4);  // cached blocks can still be taken
  ExpectAccounting(pool);
  pool.ref(b);  // a hit on a cached block takes it out of the LRU
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.num_used(), 1);
  pool.unref(b);
  ExpectAccounting(pool);
}

TEST(BlockPool, LookupVerifiesTokensNotJustTheHash) {
  BlockPool pool(2, 4);
  auto tokens = Tokens(4, 1);
  auto other = Tokens(4, 2);
  const int b = pool.allocate();
  pool.publish(b, 42, tokens.data());
  EXPECT_EQ(pool.lookup(42, tokens.data()), b);
  EXPECT_EQ(pool.lookup(42, other.data()), -1);  // same hash, other tokens: a collision
}

TEST(BlockPool, EvictsLeastRecentlyUsedOnlyWhenFreeBlocksRunOut) {
  BlockPool pool(3, 2);
  std::vector<int> blocks;
  std::vector<std::vector<int32_t>> tokens;
  for (int i = 0; i < 3; ++i) {
    tokens.push_back(Tokens(2, i));
    blocks.push_back(Published(pool, tokens[i]));
  }
  for (int i = 0; i < 3; ++i) pool.unref(blocks[i]);  // LRU order: 0, 1, 2
  EXPECT_EQ(pool.num_cached(), 3);
  const int taken = pool.allocate();
  EXPECT_EQ(taken, blocks[0]);  // the oldest is evicted first
  EXPECT_EQ(pool.lookup(hash_block(0, tokens[0].data(), 2), tokens[0].data()), -1);
  EXPECT_EQ(pool.lookup(hash_block(0, tokens[1].data(), 2), tokens[1].data()), blocks[1]);
  ExpectAccounting(pool);
  pool.unref(taken);  // unpublished now: back to the free list
  EXPECT_EQ(pool.num_free(), 1);
  ExpectAccounting(pool);
}

TEST(BlockPool, DuplicateContentStaysPrivate) {
  BlockPool pool(2, 2);
  auto tokens = Tokens(2, 7);
  const int a = Published(pool, tokens);
  const int b = Published(pool, tokens);  // same content computed twice: only `a` is shared
  pool.unref(b);
  EXPECT_EQ(pool.num_free(), 1);
  pool.unref(a);
  EXPECT_EQ(pool.num_cached(), 1);
  ExpectAccounting(pool);
}

}  // namespace
}  // namespace rtp_llm
