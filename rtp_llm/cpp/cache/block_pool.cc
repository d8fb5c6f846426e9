#include "rtp_llm/cpp/cache/block_pool.h"

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstring>

namespace rtp_llm {

BlockPool::BlockPool(int num_blocks, int block_size)
    : block_size_(block_size),
      ref_(num_blocks, 0),
      hash_of_(num_blocks, kNoHash),
      tokens_(static_cast<size_t>(num_blocks) * block_size, 0),
      lru_prev_(num_blocks, -1),
      lru_next_(num_blocks, -1) {
  free_.reserve(num_blocks);
  // Stack order: block 0 is handed out first.
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int BlockPool::allocate() {
  int block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else {
    assert(lru_head_ >= 0 && "allocate() without can_allocate()");
    block = lru_head_;
    lru_remove(block);
    evict(block);
  }
  ref_[block] = 1;
  return block;
}

void BlockPool::ref(int block) {
  if (ref_[block] == 0) {
    assert(hash_of_[block] != kNoHash);
    lru_remove(block);
  }
  ++ref_[block];
}

void BlockPool::unref(int block) {
  assert(ref_[block] > 0);
  if (--ref_[block] > 0) return;
  if (hash_of_[block] != kNoHash) {
    lru_push_back(block);
  } else {
    free_.push_back(block);
  }
}

int BlockPool::lookup(uint64_t hash, const int32_t* tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const int block = it->second;
  // Verify the tokens: a 64-bit collision must not serve another prompt's KV.
  const int32_t* stored = tokens_.data() + static_cast<size_t>(block) * block_size_;
  return std::memcmp(stored, tokens, sizeof(int32_t) * block_size_) == 0 ? block : -1;
}

void BlockPool::publish(int block, uint64_t hash, const int32_t* tokens) {
  assert(hash != kNoHash && ref_[block] > 0);
  if (hash_of_[block] != kNoHash || by_hash_.count(hash)) return;
  hash_of_[block] = hash;
  by_hash_.emplace(hash, block);
  std::copy(tokens, tokens + block_size_, tokens_.begin() + static_cast<size_t>(block) * block_size_);
}

void BlockPool::evict(int block) {
  by_hash_.erase(hash_of_[block]);
  hash_of_[block] = kNoHash;
}

void BlockPool::lru_push_back(int block) {
  lru_prev_[block] = lru_tail_;
  lru_next_[block] = -1;
  if (lru_tail_ >= 0) {
    lru_next_[lru_tail_] = block;
  } else {
    lru_head_ = block;
  }
  lru_tail_ = block;
  ++lru_size_;
}

void BlockPool::lru_remove(int block) {
  const int prev = lru_prev_[block], next = lru_next_[block];
  (prev >= 0 ? lru_next_[prev] : lru_head_) = next;
  (next >= 0 ? lru_prev_[next] : lru_tail_) = prev;
  lru_prev_[block] = lru_next_[block] = -1;
  --lru_size_;
}

uint64_t hash_block(uint64_t parent, const int32_t* tokens, int n) {
  // FNV-1a over the parent hash and the tokens, finished with a splitmix64 mix.
  uint64_t h = 1469598103934665603ULL ^ parent;
  for (int i = 0; i < n; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 1099511628211ULL;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h == 0 ? 1 : h;
}

}  // namespace rtp_llm
