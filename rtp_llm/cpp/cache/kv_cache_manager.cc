#include "rtp_llm/cpp/cache/kv_cache_manager.h"

#include <cassert>
#include <cstddef>

namespace rtp_llm {

KVCacheManager::KVCacheManager(int num_blocks, int block_size, bool reuse_cache)
    : pool_(num_blocks, block_size), prefix_cache_(reuse_cache) {}

PrefixMatch KVCacheManager::match_prefix(const int32_t* tokens, int num_tokens) const {
  PrefixMatch match;
  if (!prefix_cache_) return match;
  const int bs = block_size();
  const int max_blocks = (num_tokens - 1) / bs;
  uint64_t parent = 0;
  for (int i = 0; i < max_blocks; ++i) {
    const int32_t* block_tokens = tokens + static_cast<size_t>(i) * bs;
    const uint64_t h = hash_block(parent, block_tokens, bs);
    const int block = pool_.lookup(h, block_tokens);
    if (block < 0) break;
    match.blocks.push_back(block);
    match.hashes.push_back(h);
    if (pool_.ref_count(block) == 0) ++match.num_unreferenced;
    parent = h;
  }
  return match;
}

bool KVCacheManager::can_allocate(const BlockTable& table, const PrefixMatch& match, int num_tokens) const {
  const int have = static_cast<int>(table.blocks.size() + match.blocks.size());
  const int fresh = blocks_for(num_tokens) - have;
  return (fresh > 0 ? fresh : 0) + match.num_unreferenced <= pool_.num_available();
}

void KVCacheManager::allocate(BlockTable& table, const PrefixMatch& match, int num_tokens) {
  assert(match.blocks.empty() || table.blocks.empty());
  for (size_t i = 0; i < match.blocks.size(); ++i) {
    pool_.ref(match.blocks[i]);
    table.blocks.push_back(match.blocks[i]);
    table.hashes.push_back(match.hashes[i]);
  }
  const int need = blocks_for(num_tokens);
  while (static_cast<int>(table.blocks.size()) < need) table.blocks.push_back(pool_.allocate());
}

void KVCacheManager::record_lookup(int prompt_tokens, int hit_tokens) {
  lookup_tokens_ += prompt_tokens;
  hit_tokens_ += hit_tokens;
}

void KVCacheManager::publish_computed(BlockTable& table, const int32_t* tokens, int num_computed) {
  if (!prefix_cache_) return;
  const int bs = block_size();
  const int full = num_computed / bs;
  for (int i = static_cast<int>(table.hashes.size()); i < full; ++i) {
    const int32_t* block_tokens = tokens + static_cast<size_t>(i) * bs;
    const uint64_t parent = i == 0 ? 0 : table.hashes[i - 1];
    const uint64_t h = hash_block(parent, block_tokens, bs);
    pool_.publish(table.blocks[i], h, block_tokens);
    table.hashes.push_back(h);
  }
}

void KVCacheManager::shrink(BlockTable& table, int num_tokens) {
  const size_t keep = static_cast<size_t>(blocks_for(num_tokens));
  assert(table.hashes.size() <= keep);
  while (table.blocks.size() > keep) {
    pool_.unref(table.blocks.back());
    table.blocks.pop_back();
  }
}

void KVCacheManager::free(BlockTable& table) {
  for (auto it = table.blocks.rbegin(); it != table.blocks.rend(); ++it) pool_.unref(*it);
  table.blocks.clear();
  table.hashes.clear();
}

KVCacheStats KVCacheManager::stats() const {
  return {pool_.num_blocks(), pool_.num_free(), pool_.num_cached(), pool_.num_used(), block_size(),
          hit_tokens_, lookup_tokens_};
}

}  // namespace rtp_llm
