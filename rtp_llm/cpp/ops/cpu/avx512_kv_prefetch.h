// Prefetching the K/V blocks of paged attention (avx512_attention.cc) into L2 ahead of their
// use: which lines of which block, spread over the compute loops. x86_64 only; internal
// linkage, compiled for AVX-512 like the kernels that use it (avx512_simd.h).
#pragma once

#if !defined(__x86_64__)
#error "avx512_kv_prefetch.h is x86_64 only"
#endif

#include <algorithm>
#include <cstdint>

#include <immintrin.h>

#include "rtp_llm/cpp/ops/cpu/avx512.h"
#include "rtp_llm/cpp/ops/cpu/avx512_simd.h"

RTP_LLM_AVX512_BEGIN

namespace rtp_llm::ops::avx512 {
namespace {  // NOLINT(google-build-namespaces): see avx512_simd.h

// The cache lines of one K/V block being prefetched into L2, issued `rate` at a time from
// the compute loops' pump() calls: its K rows' lines, then its V rows'. Spread out, not as
// bursts of a block's rows (~100 lines each): those fill the core's miss buffers and stall
// it until memory delivers, so a decode took its time from cache plus the stream's
// (docs/benchmarks.md).
struct PrefetchQueue {
  const char* plane[2] = {nullptr, nullptr};
  int64_t row_stride = 0;  // bytes
  int lines_per_row = 0, rows = 0, rate = 1;
  int p = 2, r = 0, l = 0;  // the next line: plane p (2: none left), row r, line l
  inline void pump(int n) {
    for (; n > 0 && p < 2; --n) {
      _mm_prefetch(plane[p] + r * row_stride + l * 64, _MM_HINT_T1);
      if (++l == lines_per_row) {
        l = 0;
        if (++r == rows) {
          r = 0;
          ++p;
        }
      }
    }
  }
  inline void pump() { pump(rate); }
  inline void drain() { pump(1 << 30); }
  bool empty() const { return p == 2; }
};

// K/V blocks prefetched ahead of the one being computed (PrefetchQueue), counting on into the
// thread's next item (so an item's first block is not fetched on demand). The caches of all
// layers are far larger than L3 and blocks sit anywhere in the pool, which hardware
// prefetchers do not follow. Two or three blocks ahead, L1 (T0) or every other line measured
// the same or slower.
constexpr int kBlocksAhead = 1;

// The token rows of one item's block b: offset of the first row's first head, rows (0 past
// the item's keys) and bytes of each row's part that the item reads.
struct BlockRows {
  int64_t base = 0;
  int rows = 0;
  int row_bytes = 0;
};

template <class T>
BlockRows block_rows(const AttendShape& sh, const AttendItem& it, int b) {
  const int keys = it.pos + 1 - b * sh.block_size;
  if (keys <= 0) return {};
  const int64_t token_stride = int64_t{sh.num_kv_heads} * sh.head_dim;
  return {int64_t{it.block_table[b]} * sh.block_size * token_stride + int64_t{it.kv_head_begin} * sh.head_dim,
          std::min(sh.block_size, keys),
          (it.kv_head_end - it.kv_head_begin) * sh.head_dim * static_cast<int>(sizeof(T))};
}

// A queue of the lines of b's rows (empty where b.rows == 0), spread over `sites` pump()s.
template <class T>
PrefetchQueue prefetch_queue(const T* k_cache, const T* v_cache, const AttendShape& sh, const BlockRows& b,
                             int sites) {
  PrefetchQueue q;
  if (b.rows == 0) return q;
  q.plane[0] = reinterpret_cast<const char*>(k_cache + b.base);
  q.plane[1] = reinterpret_cast<const char*>(v_cache + b.base);
  q.row_stride = int64_t{sh.num_kv_heads} * sh.head_dim * static_cast<int64_t>(sizeof(T));
  q.lines_per_row = (b.row_bytes + 63) / 64;
  q.rows = b.rows;
  q.rate = std::max(1, (2 * b.rows * q.lines_per_row + sites - 1) / std::max(1, sites));
  q.p = 0;
  return q;
}

// What the pump()s of block b's loops prefetch: the block kBlocksAhead blocks on (past the
// item's last block, the thread's next item's first ones), spread over those pump()s.
template <class T>
[[gnu::always_inline]] inline PrefetchQueue block_prefetch(const T* k_cache, const T* v_cache, const AttendShape& sh,
                                                           const AttendItem& it, const AttendItem* next, int b,
                                                           int blocks, int n, bool bf16_rows) {
  const int ahead = b + kBlocksAhead;
  const BlockRows pf = ahead < blocks ? (it.prefetch ? block_rows<T>(sh, it, ahead) : BlockRows{})
                       : next && next->prefetch ? block_rows<T>(sh, *next, ahead - blocks)
                                                : BlockRows{};
  // pump()s in this block, per KV head: bf16 rows, per key slot of the 16-key score chunks
  // and per pair of keys in the values; widened rows, per key in each of the two loops.
  const int sites = (it.kv_head_end - it.kv_head_begin) * (bf16_rows ? (n + 15) / 16 * 16 + (n + 1) / 2 : 2 * n);
  return prefetch_queue(k_cache, v_cache, sh, pf, sites);
}

}  // namespace
}  // namespace rtp_llm::ops::avx512

RTP_LLM_AVX512_END
