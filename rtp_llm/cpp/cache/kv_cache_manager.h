// Per-stream KV-cache block tables on top of a BlockPool, with prefix reuse.
//
// A stream's table covers its first `num_tokens` positions: blocks[i] holds positions
// [i * block_size, (i + 1) * block_size). Full blocks whose tokens have been computed are
// published under a chained hash so later streams with the same prefix can share them.
// Every "do" has a "can I?" first; running out of blocks is an answer, never an exception.
#pragma once

#include <cstdint>
#include <vector>

#include "rtp_llm/cpp/cache/block_pool.h"

namespace rtp_llm {

struct BlockTable {
  std::vector<int32_t> blocks;
  // Chained hashes of the full, computed blocks[0 .. hashes.size()); each is published (or
  // duplicates a block that is, and then stays private to this stream).
  std::vector<uint64_t> hashes;
};

// Cached full blocks that a prompt starts with (not yet referenced by the stream).
struct PrefixMatch {
  std::vector<int32_t> blocks;
  std::vector<uint64_t> hashes;
  int num_unreferenced = 0;  // of `blocks`, how many sit in the LRU (taking them uses capacity)
  int num_tokens(int block_size) const { return static_cast<int>(blocks.size()) * block_size; }
};

struct KVCacheStats {
  int total_blocks, free_blocks, cached_blocks, used_blocks, block_size;
  int64_t hit_tokens;     // prompt tokens served from the prefix cache, cumulative
  int64_t lookup_tokens;  // prompt tokens looked up, cumulative (hit rate = hit / lookup)
};

class KVCacheManager {
 public:
  KVCacheManager(int num_blocks, int block_size, bool reuse_cache);

  int block_size() const { return pool_.block_size(); }
  int num_blocks() const { return pool_.num_blocks(); }
  int blocks_for(int num_tokens) const { return (num_tokens + block_size() - 1) / block_size(); }

  // Leading full blocks of `tokens` already cached, leaving at least one token to compute
  // (its logits produce the next token).
  PrefixMatch match_prefix(const int32_t* tokens, int num_tokens) const;

  // Can `table` (plus `match` when it is empty) be made to cover `num_tokens` positions?
  bool can_allocate(const BlockTable& table, const PrefixMatch& match, int num_tokens) const;
  bool can_grow(const BlockTable& table, int num_tokens) const { return can_allocate(table, {}, num_tokens); }
  // Precondition: can_allocate(...). Takes the matched blocks first, then fresh ones.
  void allocate(BlockTable& table, const PrefixMatch& match, int num_tokens);
  void grow(BlockTable& table, int num_tokens) { allocate(table, {}, num_tokens); }
  // Counts a prompt lookup (and its hits) in the statistics.
  void record_lookup(int prompt_tokens, int hit_tokens);

  // Publishes the full blocks among the first `num_computed` of `tokens`.
  void publish_computed(BlockTable& table, const int32_t* tokens, int num_computed);
  // Releases the blocks past the first `num_tokens` positions (speculative decoding: blocks only
  // rejected drafts reached). Precondition: none of them is published (they hold no computed
  // full block), and nothing in flight writes them.
  void shrink(BlockTable& table, int num_tokens);
  // Releases every block (tail first, so the tail is evicted before the prefix it extends).
  void free(BlockTable& table);

  KVCacheStats stats() const;
  const BlockPool& pool() const { return pool_; }

 private:
  BlockPool pool_;
  bool prefix_cache_;
  int64_t hit_tokens_ = 0, lookup_tokens_ = 0;
};

}  // namespace rtp_llm
