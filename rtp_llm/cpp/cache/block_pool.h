// Fixed pool of KV-cache blocks: reference counts, a free list, and a prefix cache of full
// blocks keyed by a chained hash, whose unreferenced members wait in an LRU until reused or
// evicted. Integers only: the tensors live on the device, indexed by these block ids.
//
// Invariant: num_free() + num_used() + num_cached() == num_blocks(), where
//   used   = ref_count > 0 (may also be in the prefix cache, shared by several streams)
//   cached = ref_count == 0 and holding a published hash (in the LRU, evictable)
//   free   = ref_count == 0 and no hash
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace rtp_llm {

class BlockPool {
 public:
  BlockPool(int num_blocks, int block_size);

  int num_blocks() const { return static_cast<int>(ref_.size()); }
  int block_size() const { return block_size_; }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_cached() const { return lru_size_; }
  int num_used() const { return num_blocks() - num_free() - num_cached(); }
  // Blocks a new allocation can take: free ones, then cached ones evicted oldest first.
  int num_available() const { return num_free() + num_cached(); }

  bool can_allocate(int n) const { return n <= num_available(); }
  // Takes one block (ref_count 1). Precondition: can_allocate(1).
  int allocate();

  // Another user of a block (a prefix-cache hit); takes it out of the LRU if it was there.
  void ref(int block);
  // Drops one user; at zero the block goes to the LRU if published, else to the free list.
  void unref(int block);
  int ref_count(int block) const { return ref_[block]; }

  // The block with this hash and these tokens (block_size of them), or -1.
  int lookup(uint64_t hash, const int32_t* tokens) const;
  // Registers a full block under `hash`. No-op when another block already holds the hash
  // (the two stay distinct; only the first is shared).
  void publish(int block, uint64_t hash, const int32_t* tokens);
  bool is_cached(int block) const { return ref_[block] == 0 && hash_of_[block] != kNoHash; }

 private:
  static constexpr uint64_t kNoHash = 0;  // hashes are never 0 (see BlockHasher)

  void lru_push_back(int block);
  void lru_remove(int block);
  void evict(int block);

  int block_size_;
  std::vector<int32_t> ref_;
  std::vector<uint64_t> hash_of_;
  std::vector<int32_t> tokens_;  // [num_blocks, block_size]: published blocks' tokens
  std::vector<int32_t> free_;    // stack of free block ids
  std::unordered_map<uint64_t, int32_t> by_hash_;
  // Intrusive LRU over unreferenced published blocks; head is the least recently used.
  std::vector<int32_t> lru_prev_, lru_next_;
  int lru_head_ = -1, lru_tail_ = -1, lru_size_ = 0;
};

// Chained block hash: h_i = H(h_{i-1}, tokens of block i). Never returns 0.
uint64_t hash_block(uint64_t parent, const int32_t* tokens, int n);

}  // namespace rtp_llm
