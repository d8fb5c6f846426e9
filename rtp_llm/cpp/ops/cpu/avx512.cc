#include "rtp_llm/cpp/ops/cpu/avx512.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <immintrin.h>

// Only the code below is compiled for AVX-512: the headers above keep their baseline code, so
// no inline function of theirs is emitted with AVX-512 instructions (the linker could keep
// that copy for the whole library).
namespace rtp_llm::ops::avx512 {
namespace {
constexpr int kMaxGroup = 16;       // query heads per KV head
constexpr int kMaxBlockSize = 64;   // tokens per KV block
constexpr int kMaxDecodeRows = 16;  // GEMM rows that run as decode tiles (one accumulator each)
}  // namespace
}  // namespace rtp_llm::ops::avx512

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")
// GCC 12's intrinsics start some results from a self-initialized `_mm512_undefined_*()`,
// which -Wmaybe-uninitialized reports once inlined here (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace rtp_llm::ops::avx512 {

namespace {

inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << remaining) - 1);
}

// Storage types: 16 elements to or from one fp32 vector. bf16 is the high half of an fp32;
// stores round to nearest even (NaN stays a quiet NaN), as c10::BFloat16 does.
struct F32 {
  using T = float;
  static __m512 load(const T* p) { return _mm512_loadu_ps(p); }
  static __m512 load(const T* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(T* p, __m512 v) { _mm512_storeu_ps(p, v); }
  static void store(T* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
  static __m512 round(__m512 v) { return v; }
};

struct BF16 {
  using T = uint16_t;
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512i rounded_bits(__m512 v) {
    const __m512i b = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000));
  }
  static __m512 load(const T* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load(const T* p, __mmask16 m) { return widen(_mm256_maskz_loadu_epi16(m, p)); }
  static __m256i narrow(__m512 v) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded_bits(v), 16)); }
  static void store(T* p, __m512 v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(v)); }
  static void store(T* p, __m512 v, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, narrow(v)); }
  static __m512 round(__m512 v) {
    return _mm512_castsi512_ps(_mm512_and_si512(rounded_bits(v), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
};

struct F16 {
  using T = uint16_t;
  static constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  static __m512 load(const T* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load(const T* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
  static void store(T* p, __m512 v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, kRound)); }
  static void store(T* p, __m512 v, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, kRound)); }
  static __m512 round(__m512 v) { return _mm512_cvtph_ps(_mm512_cvtps_ph(v, kRound)); }
};

// exp(x) to ~2 ulp (Cephes' expf polynomial); 2^n applied by vscalefps, so large negative
// x underflows to 0 and large positive x overflows to inf, as expf does.
inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.f)), _mm512_set1_ps(89.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// silu(g) = g / (1 + exp(-g)) in fp32 (silu_and_mul and the gate-up GEMM's epilogue).
inline __m512 silu512(__m512 g) {
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

// Lane j of the result = the sum of v[j]'s 16 lanes, for 16 vectors (a transpose-and-add
// tree: 45 shuffles and adds instead of 16 horizontal sums of ~9 instructions each).
inline __m512 sum16(const __m512 v[16]) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i) {
    // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] for a = v[2i], b = v[2i+1].
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {
    // Per 128-bit lane: the partial sums of v[4i .. 4i+3], in order.
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44), _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
  }
  // Add the four 128-bit lanes of each u[i] into lane group i.
  const __m512 a = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

// The cache lines of one K/V block being prefetched into L2, issued `rate` at a time from
// the compute loops' pump() calls: its K rows' lines, then its V rows'. Spread out, not as
// bursts of a block's rows (~100 lines each): those fill the core's miss buffers and stall
// it until memory delivers, so the 16 x 192-key decode at SmolLM2's shapes took its time from
// cache plus the stream's (155-210 us per layer from memory); spread, 114-135 us.
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

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")
// Scores of `group` query heads against 16 keys with `vdpbf16ps` on the bf16 rows as stored
// (exact products, fp32 sums, no widening): s[g * ld_s + j] = scale * q_g . k_j for j < keys,
// 0 beyond. q: heads q_head_stride apart; k: rows token_stride apart; C2 = head_dim / 32.
// Only where the CPU has AVX512-BF16 (bf16_gemm_supported()); called, not inlined, from
// attend_impl (compiled without it).
template <int C2, bool kPump>
void scores16_bf16(const uint16_t* q, int64_t q_head_stride, int group, const uint16_t* k,
                   int64_t token_stride, int keys, float scale, float* s, int ld_s, PrefetchQueue& pq) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int g = 0; g < group; ++g) {
    __m512bh qb[C2];
    for (int c = 0; c < C2; ++c) qb[c] = (__m512bh)_mm512_loadu_si512(q + g * q_head_stride + c * 32);
    __m512 dot[16];
    for (int j = 0; j < 16; ++j) {
      if (kPump && g == 0) pq.pump();
      dot[j] = _mm512_setzero_ps();
      if (j < keys) {
        for (int c = 0; c < C2; ++c)
          dot[j] = _mm512_dpbf16_ps(dot[j], (__m512bh)_mm512_loadu_si512(k + j * token_stride + c * 32), qb[c]);
      }
    }
    _mm512_store_ps(s + g * ld_s, _mm512_mul_ps(sum16(dot), vscale));
  }
}

// Values of `group` query heads over one block's n keys with `vdpbf16ps`: acc[g * C + c] +=
// sum_j bf16(p[g * ld_p + j]) * v_j, fp32 sums of exact products (torch's CPU flash attention
// also rounds the probabilities to bf16 before multiplying by V). V rows (token_stride apart)
// are interleaved in pairs of keys, a missing odd key as zeros, so acc's lanes hold the dims
// in unpacklo/hi's order: lane 4L + i of acc[.., 2 c2] is dim 32 c2 + 8L + i, of
// acc[.., 2 c2 + 1] dim 32 c2 + 8L + 4 + i (unpermute_values puts them back). A quarter of
// the instructions of widening V and an FMA per key; 11% off the 16 x 192-key decode from
// cache, none from memory, where the K/V stream bounds it.
template <int C, bool kPump>
void values_bf16(const uint16_t* v, int64_t token_stride, int n, const float* p, int ld_p, int group, __m512* acc,
                 PrefetchQueue& pq) {
  constexpr int C2 = C / 2;
  alignas(64) __m512i vp[kMaxBlockSize / 2][C];
  const int pairs = (n + 1) / 2;
  for (int jp = 0; jp < pairs; ++jp) {
    if (kPump) pq.pump();
    const uint16_t* r0 = v + 2 * jp * token_stride;
    const bool odd = 2 * jp + 1 < n;
    for (int c2 = 0; c2 < C2; ++c2) {
      const __m512i a = _mm512_loadu_si512(r0 + c2 * 32);
      const __m512i b = odd ? _mm512_loadu_si512(r0 + token_stride + c2 * 32) : _mm512_setzero_si512();
      vp[jp][2 * c2] = _mm512_unpacklo_epi16(a, b);
      vp[jp][2 * c2 + 1] = _mm512_unpackhi_epi16(a, b);
    }
  }
  for (int g = 0; g < group; ++g) {
    alignas(64) int32_t pb[kMaxBlockSize / 2];  // the probabilities' pairs in bf16, zeros past n
    for (int j = 0; j < n; j += 16) {
      const __m512 pr = _mm512_maskz_loadu_ps(tail_mask(n - j), p + g * ld_p + j);
      _mm256_store_si256(reinterpret_cast<__m256i*>(pb + j / 2), (__m256i)_mm512_cvtneps_pbh(pr));
    }
    __m512 even[C], odd[C];  // 2C chains (vdpbf16ps' latency is ~6 cycles)
    for (int c = 0; c < C; ++c) {
      even[c] = acc[g * C + c];
      odd[c] = _mm512_setzero_ps();
    }
    int jp = 0;
    for (; jp + 2 <= pairs; jp += 2) {
      const __m512bh p0 = (__m512bh)_mm512_set1_epi32(pb[jp]), p1 = (__m512bh)_mm512_set1_epi32(pb[jp + 1]);
      for (int c = 0; c < C; ++c) {
        even[c] = _mm512_dpbf16_ps(even[c], (__m512bh)vp[jp][c], p0);
        odd[c] = _mm512_dpbf16_ps(odd[c], (__m512bh)vp[jp + 1][c], p1);
      }
    }
    if (jp < pairs) {
      const __m512bh p0 = (__m512bh)_mm512_set1_epi32(pb[jp]);
      for (int c = 0; c < C; ++c) even[c] = _mm512_dpbf16_ps(even[c], (__m512bh)vp[jp][c], p0);
    }
    for (int c = 0; c < C; ++c) acc[g * C + c] = _mm512_add_ps(even[c], odd[c]);
  }
}

#pragma GCC pop_options

// K/V blocks prefetched ahead of the one being computed (PrefetchQueue), counting on into the
// thread's next item (so an item's first block is not fetched on demand). The caches of all
// layers are far larger than L3 and blocks sit anywhere in the pool, which hardware
// prefetchers do not follow. Two or three blocks ahead, L1 (T0) or every other line measured
// the same or slower.
constexpr int kBlocksAhead = 1;

// values_bf16's accumulators back in the dims' order, for `heads` heads.
template <int C>
inline void unpermute_values(__m512 (*acc)[C], int heads) {
  const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int h = 0; h < heads; ++h) {
    for (int c = 0; c < C; c += 2) {
      const __m512 a = acc[h][c], b = acc[h][c + 1];
      acc[h][c] = _mm512_permutex2var_ps(a, lo, b);
      acc[h][c + 1] = _mm512_permutex2var_ps(a, hi, b);
    }
  }
}

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

// C = head_dim / 16 vectors per head row. One query token, KV heads [kvh0, kvh1): per block,
// each KV head in turn (so the block's token rows, kv_heads x head_dim contiguous, are read
// whole while they are in cache, rather than one head's 128-256 byte slice of each). Per key
// and KV head: C loads, group x C FMAs and one horizontal sum per query head for the scores,
// group x C FMAs for the values (bf16 rows where the CPU has AVX512-BF16: `vdpbf16ps` on them
// as stored, scores16_bf16 and values_bf16); the softmax runs 16 keys per instruction. The
// block kBlocksAhead blocks on is prefetched over the block's loops (PrefetchQueue).
template <class E, int C>
void attend_impl(const typename E::T* k_cache, const typename E::T* v_cache, const AttendShape& sh,
                 const AttendItem& it, const AttendItem* next, bool first) {
  using T = typename E::T;
  constexpr int D = C * 16;
  static const bool bf16_dot = bf16_gemm_supported();
  const T* q = static_cast<const T*>(it.q);
  T* out = static_cast<T*>(it.out);
  const int kvh0 = it.kv_head_begin, kvh1 = it.kv_head_end, group = sh.group, block_size = sh.block_size;
  const int64_t q_head_stride = sh.q_head_stride;
  const float scale = sh.scale;
  const int heads = (kvh1 - kvh0) * group;  // query heads of the item, <= kMaxItemHeads
  __m512 qf[kMaxItemHeads][C], acc[kMaxItemHeads][C];
  alignas(64) float s[kMaxGroup][kMaxBlockSize];
  alignas(64) float kf[16][C][16];              // 16 keys widened to fp32
  alignas(64) float vf[kMaxBlockSize][C][16];  // the block's V rows widened to fp32
  float m[kMaxItemHeads], l[kMaxItemHeads];
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int h = 0; h < heads; ++h) {
    for (int c = 0; c < C; ++c) {
      qf[h][c] = _mm512_mul_ps(E::load(q + h * q_head_stride + c * 16), vscale);
      acc[h][c] = _mm512_setzero_ps();
    }
    m[h] = -std::numeric_limits<float>::infinity();
    l[h] = 0.f;
  }
  const int64_t token_stride = int64_t{sh.num_kv_heads} * D;
  const int num_keys = it.pos + 1;
  const int blocks = (num_keys + block_size - 1) / block_size;
  const int kv_heads = kvh1 - kvh0;
  const bool bf16_rows = bf16_dot && std::is_same_v<E, BF16>;
  if (first && it.prefetch) {
    for (int b = 0; b < kBlocksAhead; ++b) prefetch_queue(k_cache, v_cache, sh, block_rows<T>(sh, it, b), 1).drain();
  }
  for (int start = 0; start < num_keys; start += block_size) {
    const int n = std::min(block_size, num_keys - start);
    const int64_t block = int64_t{it.block_table[start / block_size]} * block_size * token_stride + int64_t{kvh0} * D;
    const int ahead = start / block_size + kBlocksAhead;
    const BlockRows pf = ahead < blocks ? (it.prefetch ? block_rows<T>(sh, it, ahead) : BlockRows{})
                         : next && next->prefetch ? block_rows<T>(sh, *next, ahead - blocks)
                                                  : BlockRows{};
    // pump()s in this block, per KV head: bf16 rows, per key slot of the 16-key score chunks
    // and per pair of keys in the values; widened rows, per key in each of the two loops.
    const int sites = kv_heads * (bf16_rows ? (n + 15) / 16 * 16 + (n + 1) / 2 : 2 * n);
    PrefetchQueue pq = prefetch_queue(k_cache, v_cache, sh, pf, sites);
    for (int kvh = 0; kvh < kv_heads; ++kvh) {
      const typename E::T* kb = k_cache + block + kvh * D;
      const typename E::T* vb = v_cache + block + kvh * D;
      __m512(*qg)[C] = qf + kvh * group;
      __m512(*ag)[C] = acc + kvh * group;
      float* mg = m + kvh * group;
      float* lg = l + kvh * group;
      // Scores, 16 keys at a time: the keys are widened to fp32 once into kf (L1), then per
      // query head 16 partial-dot vectors are summed by one tree (bf16 rows with AVX512-BF16:
      // `vdpbf16ps` on them as stored, scores16_bf16, ~2x fewer instructions).
      for (int j0 = 0; j0 < n; j0 += 16) {
        const int keys = std::min(16, n - j0);
        if constexpr (std::is_same_v<E, BF16>) {
          if (bf16_dot) {
            // (Without lines to prefetch, a copy without the pumps: prompts' items run from
            // cache, compute-bound.)
            (pq.empty() ? scores16_bf16<C / 2, false> : scores16_bf16<C / 2, true>)(
                q + kvh * group * q_head_stride, q_head_stride, group, kb + j0 * token_stride, token_stride, keys,
                scale, &s[0][j0], kMaxBlockSize, pq);
            continue;
          }
        }
        for (int j = 0; j < keys; ++j) {
          pq.pump();
          for (int c = 0; c < C; ++c) _mm512_store_ps(kf[j][c], E::load(kb + (j0 + j) * token_stride + c * 16));
        }
        for (int j = keys; j < 16; ++j) {
          for (int c = 0; c < C; ++c) _mm512_store_ps(kf[j][c], _mm512_setzero_ps());
        }
        for (int g = 0; g < group; ++g) {
          __m512 dot[16];
          for (int j = 0; j < 16; ++j) {
            dot[j] = _mm512_mul_ps(qg[g][0], _mm512_load_ps(kf[j][0]));
            for (int c = 1; c < C; ++c) dot[j] = _mm512_fmadd_ps(qg[g][c], _mm512_load_ps(kf[j][c]), dot[j]);
          }
          _mm512_store_ps(s[g] + j0, sum16(dot));
        }
      }
      for (int g = 0; g < group; ++g) {
        __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        for (int j = 0; j < n; j += 16) vmax = _mm512_mask_max_ps(vmax, tail_mask(n - j), vmax, _mm512_load_ps(s[g] + j));
        const float block_max = std::max(mg[g], _mm512_reduce_max_ps(vmax));
        const __m512 bmax = _mm512_set1_ps(block_max);
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < n; j += 16) {
          const __mmask16 mask = tail_mask(n - j);
          const __m512 e = exp512(_mm512_sub_ps(_mm512_load_ps(s[g] + j), bmax));
          _mm512_mask_store_ps(s[g] + j, mask, e);
          sum = _mm512_mask_add_ps(sum, mask, sum, e);
        }
        const float rescale = std::exp(mg[g] - block_max);  // 0 for the first block (m = -inf)
        lg[g] = lg[g] * rescale + _mm512_reduce_add_ps(sum);
        if (rescale != 1.f) {
          const __m512 r = _mm512_set1_ps(rescale);
          for (int c = 0; c < C; ++c) ag[g][c] = _mm512_mul_ps(ag[g][c], r);
        }
        mg[g] = block_max;
      }
      if constexpr (std::is_same_v<E, BF16>) {
        if (bf16_dot) {
          (pq.empty() ? values_bf16<C, false> : values_bf16<C, true>)(vb, token_stride, n, s[0], kMaxBlockSize, group,
                                                                      &ag[0][0], pq);
          continue;
        }
      }
      // Values: the block's V rows widened once into vf (L1), then per query head register
      // accumulators over the block, even and odd keys apart (2C FMA chains).
      for (int j = 0; j < n; ++j) {
        pq.pump();
        for (int c = 0; c < C; ++c) _mm512_store_ps(vf[j][c], E::load(vb + j * token_stride + c * 16));
      }
      for (int g = 0; g < group; ++g) {
        __m512 even[C], odd[C];
        for (int c = 0; c < C; ++c) {
          even[c] = ag[g][c];
          odd[c] = _mm512_setzero_ps();
        }
        int j = 0;
        for (; j + 2 <= n; j += 2) {
          const __m512 p0 = _mm512_set1_ps(s[g][j]), p1 = _mm512_set1_ps(s[g][j + 1]);
          for (int c = 0; c < C; ++c) {
            even[c] = _mm512_fmadd_ps(p0, _mm512_load_ps(vf[j][c]), even[c]);
            odd[c] = _mm512_fmadd_ps(p1, _mm512_load_ps(vf[j + 1][c]), odd[c]);
          }
        }
        if (j < n) {
          const __m512 p0 = _mm512_set1_ps(s[g][j]);
          for (int c = 0; c < C; ++c) even[c] = _mm512_fmadd_ps(p0, _mm512_load_ps(vf[j][c]), even[c]);
        }
        for (int c = 0; c < C; ++c) ag[g][c] = _mm512_add_ps(even[c], odd[c]);
      }
    }
    pq.drain();  // what the pumps left (a fuller block than this one: the next item's)
  }
  if (bf16_rows) unpermute_values<C>(acc, heads);
  for (int h = 0; h < heads; ++h) {
    const __m512 inv = _mm512_set1_ps(l[h] > 0.f ? 1.f / l[h] : 0.f);  // no keys (pos < 0): zeros
    for (int c = 0; c < C; ++c) E::store(out + h * q_head_stride + c * 16, _mm512_mul_ps(acc[h][c], inv));
  }
}

template <class E>
void attend_typed(const void* k, const void* v, const AttendShape& sh, const AttendItem& it, const AttendItem* next,
                  bool first) {
  using T = typename E::T;
  const auto* kp = static_cast<const T*>(k);
  const auto* vp = static_cast<const T*>(v);
  switch (sh.head_dim) {
    case 32: return attend_impl<E, 2>(kp, vp, sh, it, next, first);
    case 64: return attend_impl<E, 4>(kp, vp, sh, it, next, first);
    case 128: return attend_impl<E, 8>(kp, vp, sh, it, next, first);
    default: std::abort();  // attention_supports() said no
  }
}

// 1 / rms of a row whose squares summed to sum_sq (lanes summed here).
inline __m512 inv_rms(__m512 sum_sq, int64_t dim, float eps) {
  return _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(sum_sq) / static_cast<float>(dim) + eps));
}

// out = round(w * round(row * inv)): HF's order (normalize, round to the dtype, scale).
template <class E>
void scale_row(const typename E::T* row, const typename E::T* w, typename E::T* out, int64_t dim, __m512 inv) {
  for (int64_t i = 0; i < dim; i += 16) {
    const __mmask16 mask = tail_mask(dim - i);
    const __m512 normed = E::round(_mm512_mul_ps(E::load(row + i, mask), inv));
    E::store(out + i, _mm512_mul_ps(E::load(w + i, mask), normed), mask);
  }
}

template <class E>
void rms_norm_rows(const typename E::T* x, const typename E::T* w, typename E::T* out, int64_t rows, int64_t dim,
                   float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const typename E::T* row = x + r * dim;
    __m512 sq = _mm512_setzero_ps();
    for (int64_t i = 0; i < dim; i += 16) {
      const __m512 v = E::load(row + i, tail_mask(dim - i));
      sq = _mm512_fmadd_ps(v, v, sq);
    }
    scale_row<E>(row, w, out + r * dim, dim, inv_rms(sq, dim, eps));
  }
}

template <class E>
void add_rms_norm_rows(const typename E::T* x, typename E::T* residual, const typename E::T* w, typename E::T* out,
                       int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    typename E::T* res = residual + r * dim;
    const typename E::T* in = x + r * dim;
    __m512 sq = _mm512_setzero_ps();
    for (int64_t i = 0; i < dim; i += 16) {
      const __mmask16 mask = tail_mask(dim - i);
      const __m512 h = E::round(_mm512_add_ps(E::load(res + i, mask), E::load(in + i, mask)));
      E::store(res + i, h, mask);
      sq = _mm512_fmadd_ps(h, h, sq);
    }
    scale_row<E>(res, w, out + r * dim, dim, inv_rms(sq, dim, eps));
  }
}

template <class E>
void silu_and_mul_range(const typename E::T* x, typename E::T* out, int64_t inter, int64_t begin, int64_t end) {
  while (begin < end) {
    const int64_t r = begin / inter, j = begin % inter;
    const int64_t n = std::min(end - begin, inter - j);  // the rest of this row
    const typename E::T* gate = x + r * 2 * inter + j;
    const typename E::T* up = gate + inter;
    typename E::T* o = out + begin;
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 mask = tail_mask(n - i);
      const __m512 g = E::load(gate + i, mask);
      // HF: act(gate) rounded to the dtype, then times up.
      const __m512 act = E::round(silu512(g));
      E::store(o + i, _mm512_mul_ps(act, E::load(up + i, mask)), mask);
    }
    begin += n;
  }
}

template <class E>
void rotate_heads_impl(typename E::T* x, int64_t heads, int64_t head_stride, int64_t half, const float* cos,
                       const float* sin) {
  for (int64_t h = 0; h < heads; ++h) {
    typename E::T* v = x + h * head_stride;
    for (int64_t i = 0; i < half; i += 16) {
      const __mmask16 mask = tail_mask(half - i);
      const __m512 x1 = E::load(v + i, mask), x2 = E::load(v + half + i, mask);
      const __m512 c = _mm512_maskz_loadu_ps(mask, cos + i), s = _mm512_maskz_loadu_ps(mask, sin + i);
      // HF's arithmetic: q * cos + rotate_half(q) * sin, each product rounded (no FMA).
      E::store(v + i, _mm512_sub_ps(_mm512_mul_ps(x1, c), _mm512_mul_ps(x2, s)), mask);
      E::store(v + half + i, _mm512_add_ps(_mm512_mul_ps(x2, c), _mm512_mul_ps(x1, s)), mask);
    }
  }
}

// Calls f.template operator()<E>() for the storage type of dtype.
template <class F>
void with_type(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::kF32: return f(F32{});
    case Dtype::kBF16: return f(BF16{});
    case Dtype::kF16: return f(F16{});
  }
}

}  // namespace

void attend(Dtype dtype, const void* k_cache, const void* v_cache, const AttendShape& shape, const AttendItem& item,
            const AttendItem* next, bool first) {
  with_type(dtype, [&](auto e) { attend_typed<decltype(e)>(k_cache, v_cache, shape, item, next, first); });
}

void rms_norm(Dtype dtype, const void* x, const void* w, void* out, int64_t rows, int64_t dim, float eps) {
  with_type(dtype, [&](auto e) {
    using T = typename decltype(e)::T;
    rms_norm_rows<decltype(e)>(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(out), rows, dim,
                               eps);
  });
}

void add_rms_norm(Dtype dtype, const void* x, void* residual, const void* w, void* out, int64_t rows, int64_t dim,
                  float eps) {
  with_type(dtype, [&](auto e) {
    using T = typename decltype(e)::T;
    add_rms_norm_rows<decltype(e)>(static_cast<const T*>(x), static_cast<T*>(residual), static_cast<const T*>(w),
                                   static_cast<T*>(out), rows, dim, eps);
  });
}

void rotate_heads(Dtype dtype, void* x, int64_t heads, int64_t head_stride, int64_t half, const float* cos,
                  const float* sin) {
  with_type(dtype, [&](auto e) {
    using T = typename decltype(e)::T;
    rotate_heads_impl<decltype(e)>(static_cast<T*>(x), heads, head_stride, half, cos, sin);
  });
}

// 16 lanes keep their largest and its first index; the lanes' winners are compared at the end.
int64_t argmax(const float* x, int64_t n) {
  __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512i best_idx = _mm512_set1_epi32(0);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  for (int64_t i = 0; i < n; i += 16, idx = _mm512_add_epi32(idx, step)) {
    const __mmask16 mask = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(mask, x + i);
    if (_mm512_mask_cmp_ps_mask(mask, v, v, _CMP_UNORD_Q)) {
      for (int64_t j = i;; ++j) {
        if (std::isnan(x[j])) return j;
      }
    }
    const __mmask16 greater = _mm512_mask_cmp_ps_mask(mask, v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, greater, v);
    best_idx = _mm512_mask_mov_epi32(best_idx, greater, idx);
  }
  const float top = _mm512_reduce_max_ps(best);
  const __mmask16 winners = _mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ);
  // n > 0: some lane holds the maximum (all -inf: lane 0's first element, index 0).
  return _mm512_mask_reduce_min_epi32(winners, best_idx);
}

void silu_and_mul(Dtype dtype, const void* x, void* out, int64_t inter, int64_t begin, int64_t end) {
  with_type(dtype, [&](auto e) {
    using T = typename decltype(e)::T;
    silu_and_mul_range<decltype(e)>(static_cast<const T*>(x), static_cast<T*>(out), inter, begin, end);
  });
}

}  // namespace rtp_llm::ops::avx512

#pragma GCC diagnostic pop
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's _mm512_set1_epi16: as above
namespace rtp_llm::ops::avx512 {
namespace {

// 12 independent `vdpbf16ps` chains (more than latency x throughput) of `iters` steps each;
// returns the sum so the work is kept.
float bf16_dot_chains(int64_t iters) {
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int i = 0; i < kChains; i++) acc[i] = _mm512_setzero_ps();
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  __m512bh b = (__m512bh)_mm512_set1_epi16(0x0001);  // tiny: the sums stay finite
  for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a), "+v"(b));  // not hoisted out of the loop
  }
  float s = 0.f;
  for (int i = 0; i < kChains; i++) s += _mm512_reduce_add_ps(acc[i]);
  return s;
}

double bf16_dot_peak_measure(int threads) {
  constexpr int64_t kIters = 20'000'000;  // ~0.1 s per thread
  std::vector<float> sink(threads);
  const auto t0 = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) sink[i] = bf16_dot_chains(kIters);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float keep = sink[0];
  (void)keep;
  return threads * static_cast<double>(kIters) * 12 * 64 / s / 1e9;  // 16 lanes x 2 products x 2 FLOP
}

// Where a GEMM tile's fp32 sums go. A plain projection rounds each to bf16; kBlocksPerOut:
// 16-column weight blocks per 16-column block of out.
struct StoreBf16 {
  static constexpr int kBlocksPerOut = 1;
  template <int MR, int NB>
  static void store(const __m512 (&acc)[MR][NB], uint16_t* out, int64_t ldo) {
    for (int r = 0; r < MR; r++)
      for (int c = 0; c < NB; c++)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo + c * 16), (__m256i)_mm512_cvtneps_pbh(acc[r][c]));
  }
};

// The MLP's gate and up projections in one, their weight blocks interleaved (gate block j,
// then up block j): out = silu(gate) * up with the roundings of a plain projection followed
// by silu_and_mul (gate and up to bf16, silu's result to bf16, the product to bf16).
struct SiluMulBf16 {
  static constexpr int kBlocksPerOut = 2;
  static __m256i combine(__m512 gate, __m512 up) {
    const __m512 g = BF16::widen((__m256i)_mm512_cvtneps_pbh(gate));
    const __m512 u = BF16::widen((__m256i)_mm512_cvtneps_pbh(up));
    return BF16::narrow(_mm512_mul_ps(BF16::round(silu512(g)), u));
  }
  template <int MR, int NB>
  static void store(const __m512 (&acc)[MR][NB], uint16_t* out, int64_t ldo) {
    static_assert(NB % 2 == 0, "gate and up blocks come in pairs");
    for (int r = 0; r < MR; r++)
      for (int c = 0; c < NB / 2; c++)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo + c * 16), combine(acc[r][2 * c], acc[r][2 * c + 1]));
  }
};

// Prefill: MR rows x NB consecutive 16-column blocks of out, an fp32 accumulator per (row,
// block); per pair of k, one 64-byte weight load per block and, per row, the row's two x values
// broadcast into NB `vdpbf16ps` (4 x 4: 4 + 4 loads per 16). The blocks are re-read from L2 for
// every MR rows of a panel.
template <int MR, int NB, class Ep>
inline void gemm_tile(const uint16_t* x, int64_t ldx, const uint16_t* wb, int64_t K, uint16_t* out, int64_t ldo) {
  __m512 acc[MR][NB];
  for (int r = 0; r < MR; r++)
    for (int c = 0; c < NB; c++) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 2) {
    __m512bh w[NB];
    for (int c = 0; c < NB; c++) w[c] = (__m512bh)_mm512_loadu_si512(wb + c * K * 16 + k * 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
      int32_t pair;
      std::memcpy(&pair, x + r * ldx + k, sizeof(pair));
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
      for (int c = 0; c < NB; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xb, w[c]);
    }
  }
  Ep::template store<MR, NB>(acc, out, ldo);
}

// Prefill rows [m0, m1) of one output block's weight blocks (the last blocks of an N % 64 != 0).
template <class Ep>
inline void gemm_block_rows(const uint16_t* x, int64_t ldx, const uint16_t* wb, int64_t K, uint16_t* o, int64_t ldo,
                            int64_t m0, int64_t m1) {
  constexpr int U = Ep::kBlocksPerOut;
  int64_t m = m0;
  for (; m + 4 <= m1; m += 4) gemm_tile<4, U, Ep>(x + m * ldx, ldx, wb, K, o + m * ldo, ldo);
  for (; m < m1; m++) gemm_tile<1, U, Ep>(x + m * ldx, ldx, wb, K, o + m * ldo, ldo);
}

// Decode batches: MR (<= 16) rows, one 16-column block. xp holds the rows' pairs of k
// interleaved ([K / 2][MR] int32, interleave_pairs), so one pointer walks every row (MR row
// pointers spill at 16 rows); one accumulator per row. The block's weights stream once, from
// memory, prefetched 2 KB ahead. Each weight byte feeds MR FLOP, so at 16 rows the tile needs
// the cores' full bf16 peak and ~30 GB/s at once: on Qwen2.5-0.5B's decode step 326 GFLOP/s
// (20 GB/s) against 286 for 8-row pointer tiles (two passes) and 230 for 16 spilled pointers.
template <int MR>
inline void decode_block(const uint16_t* xp, const uint16_t* wb, int64_t K, __m512 (&sums)[MR]) {
  __m512 acc[MR];
  for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 2, xp += 2 * MR) {
    const __m512bh w = (__m512bh)_mm512_loadu_si512(wb + k * 16);
    // (An address, not a pointer: it may lie past the buffer's end; prefetches never fault.)
    _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(wb + k * 16) + 2048), _MM_HINT_T0);
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
      int32_t pair;
      std::memcpy(&pair, xp + 2 * r, sizeof(pair));
      acc[r] = _mm512_dpbf16_ps(acc[r], w, (__m512bh)_mm512_set1_epi32(pair));
    }
  }
  for (int r = 0; r < MR; r++) sums[r] = acc[r];
}

// In place: r[i] holds row i of a 16 x 16 int32 matrix on entry, column i on return.
inline void transpose16x16(__m512i r[16]) {
  // (The maskz forms with every lane set: the plain ones start from an undefined vector, which
  // GCC 12 reports as maybe-uninitialized wherever they are inlined.)
  constexpr __mmask16 kAll16 = 0xFFFF;
  constexpr __mmask8 kAll8 = 0xFF;
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // t[2i], t[2i + 1], lane L: rows 2i, 2i + 1 of columns 4L..4L+3
    t[i] = _mm512_maskz_unpacklo_epi32(kAll16, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(kAll16, r[i], r[i + 1]);
  }
  for (int q = 0; q < 16; q += 4) {  // r[4q + c], lane L: rows 4q..4q+3 of column 4L + c
    r[q] = _mm512_maskz_unpacklo_epi64(kAll8, t[q], t[q + 2]);
    r[q + 1] = _mm512_maskz_unpackhi_epi64(kAll8, t[q], t[q + 2]);
    r[q + 2] = _mm512_maskz_unpacklo_epi64(kAll8, t[q + 1], t[q + 3]);
    r[q + 3] = _mm512_maskz_unpackhi_epi64(kAll8, t[q + 1], t[q + 3]);
  }
  for (int c = 0; c < 4; c++) {  // gather lane L of r[c], r[4 + c], r[8 + c], r[12 + c]
    const __m512i v0 = _mm512_maskz_shuffle_i32x4(kAll16, r[c], r[4 + c], 0x88);
    const __m512i v1 = _mm512_maskz_shuffle_i32x4(kAll16, r[c], r[4 + c], 0xdd);
    const __m512i w0 = _mm512_maskz_shuffle_i32x4(kAll16, r[8 + c], r[12 + c], 0x88);
    const __m512i w1 = _mm512_maskz_shuffle_i32x4(kAll16, r[8 + c], r[12 + c], 0xdd);
    t[c] = _mm512_maskz_shuffle_i32x4(kAll16, v0, w0, 0x88);
    t[4 + c] = _mm512_maskz_shuffle_i32x4(kAll16, v1, w1, 0x88);
    t[8 + c] = _mm512_maskz_shuffle_i32x4(kAll16, v0, w0, 0xdd);
    t[12 + c] = _mm512_maskz_shuffle_i32x4(kAll16, v1, w1, 0xdd);
  }
  for (int i = 0; i < 16; i++) r[i] = t[i];
}

// x's M (<= 16) rows as pairs of k interleaved, xp [K / 2][M][2]: xp[p][r] = row r's elements
// 2p, 2p + 1; 16 pairs at a time through one register transpose (~70 cycles per 16 x 16).
inline void interleave_pairs(const uint16_t* x, int64_t ldx, int64_t M, int64_t K, int32_t* xp) {
  const int64_t pairs = K / 2;
  for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
    const __mmask16 m = tail_mask(pairs - p0);
    __m512i r[16];
    for (int64_t i = 0; i < 16; i++)
      r[i] = i < M ? _mm512_maskz_loadu_epi32(m, x + i * ldx + 2 * p0) : _mm512_setzero_si512();
    transpose16x16(r);
    const __mmask16 rows = tail_mask(M);
    for (int64_t i = 0; i < std::min<int64_t>(16, pairs - p0); i++) _mm512_mask_storeu_epi32(xp + (p0 + i) * M, rows, r[i]);
  }
}

// The threads split the output blocks, each of Ep::kBlocksPerOut weight blocks.
template <int MR, class Ep>
void decode_gemm(const uint16_t* xp, const uint16_t* wp, uint16_t* out, int64_t ldo, int64_t blocks, int64_t K) {
  constexpr int U = Ep::kBlocksPerOut;
  at::parallel_for(0, blocks / U, 2 / U, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; j++) {
      __m512 acc[MR][U];
      for (int u = 0; u < U; u++) {
        __m512 sums[MR];
        decode_block<MR>(xp, wp + (j * U + u) * K * 16, K, sums);
        for (int r = 0; r < MR; r++) acc[r][u] = sums[r];
      }
      Ep::template store<MR, U>(acc, out + j * 16, ldo);
    }
  });
}

using DecodeGemm = void (*)(const uint16_t*, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t);

template <class Ep, int... MR>
constexpr std::array<DecodeGemm, sizeof...(MR)> decode_gemms(std::integer_sequence<int, MR...>) {
  return {&decode_gemm<MR + 1, Ep>...};
}

template <class Ep>
void bf16_gemm_impl(const uint16_t* x, int64_t ldx, const uint16_t* wp, uint16_t* out, int64_t ldo, int64_t M,
                    int64_t N, int64_t K) {
  constexpr int U = Ep::kBlocksPerOut;
  const int64_t blocks = N / 16;
  if (M <= kMaxDecodeRows) {
    // Decode batches: each block's weights stream from memory once, for all rows; the
    // threads split the blocks. One row is its own interleaving.
    static constexpr auto kDecode = decode_gemms<Ep>(std::make_integer_sequence<int, kMaxDecodeRows>{});
    const uint16_t* xs = x;
    if (M > 1) {
      thread_local std::vector<int32_t> xp;
      if (static_cast<int64_t>(xp.size()) < K / 2 * M) xp.resize(K / 2 * M);
      interleave_pairs(x, ldx, M, K, xp.data());
      xs = reinterpret_cast<const uint16_t*>(xp.data());
    }
    kDecode[M - 1](xs, wp, out, ldo, blocks, K);
    return;
  }
  // Prefill: panels of rows stay in L2 while groups of 4 blocks stream past. The threads
  // split (panel, group) units, panel by panel, in one parallel region: splitting each
  // panel's groups left a thread idle for a group in ten at SmolLM2's 576 columns (9 groups)
  // and forked twice per panel.
  constexpr int64_t kPanel = 256, kGroup = 4;
  static_assert(kGroup % U == 0, "a group holds whole output blocks");
  const int64_t groups = blocks / kGroup;
  const int64_t rest = (blocks - groups * kGroup) / U;  // output blocks after the groups
  const int64_t per_panel = groups + rest, panels = (M + kPanel - 1) / kPanel;
  at::parallel_for(0, panels * per_panel, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; unit++) {
      const int64_t m0 = unit / per_panel * kPanel, m1 = std::min(M, m0 + kPanel), j = unit % per_panel;
      if (j >= groups) {  // one output block of the last < 4 blocks
        const int64_t b = groups * kGroup / U + (j - groups);
        gemm_block_rows<Ep>(x, ldx, wp + b * U * K * 16, K, out + b * 16, ldo, m0, m1);
        continue;
      }
      const uint16_t* wg = wp + j * kGroup * K * 16;
      uint16_t* o = out + j * kGroup / U * 16;
      int64_t m = m0;
      for (; m + 4 <= m1; m += 4) gemm_tile<4, kGroup, Ep>(x + m * ldx, ldx, wg, K, o + m * ldo, ldo);
      for (; m < m1; m++) gemm_tile<1, kGroup, Ep>(x + m * ldx, ldx, wg, K, o + m * ldo, ldo);
    }
  });
}

}  // namespace
}  // namespace rtp_llm::ops::avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options

// Run on every CPU: compiled for the baseline ISA, outside the AVX-512 region above.
namespace rtp_llm::ops::avx512 {

namespace {

bool disabled_by_env() {
  const char* v = std::getenv("RTP_LLM_CPU_AVX512");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace

bool supported() {
  // RTP_LLM_CPU_AVX512=0 runs the portable kernels (their tests; comparing speed).
  static const bool ok = !disabled_by_env() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return ok;
}

std::optional<Dtype> usable_for(c10::ScalarType t) { return supported() ? dtype_of(t) : std::nullopt; }

bool attention_supports(int head_dim, int group, int block_size) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128) && group <= kMaxGroup &&
         block_size <= kMaxBlockSize;
}

double bf16_dot_peak_gflops() {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) return 0.0;
  return bf16_dot_peak_measure(at::get_num_threads());
}

bool bf16_gemm_supported() {
  static const bool ok = supported() && __builtin_cpu_supports("avx512bf16");
  return ok;
}

void bf16_gemm(const uint16_t* x, int64_t ldx, const uint16_t* w_packed, uint16_t* out, int64_t ldo, int64_t M,
               int64_t N, int64_t K) {
  if (!bf16_gemm_supported()) std::abort();  // callers check bf16_gemm_supported()
  bf16_gemm_impl<StoreBf16>(x, ldx, w_packed, out, ldo, M, N, K);
}

void bf16_gemm_silu(const uint16_t* x, int64_t ldx, const uint16_t* w_packed, uint16_t* out, int64_t ldo, int64_t M,
                    int64_t N, int64_t K) {
  if (!bf16_gemm_supported() || N % 32 != 0) std::abort();  // callers check both
  bf16_gemm_impl<SiluMulBf16>(x, ldx, w_packed, out, ldo, M, N, K);
}

}  // namespace rtp_llm::ops::avx512

#else  // not x86_64: the portable kernels run

namespace rtp_llm::ops::avx512 {

bool supported() { return false; }
std::optional<Dtype> usable_for(c10::ScalarType) { return std::nullopt; }
bool attention_supports(int, int, int) { return false; }
void attend(Dtype, const void*, const void*, const AttendShape&, const AttendItem&, const AttendItem*, bool) {
  std::abort();
}
void rms_norm(Dtype, const void*, const void*, void*, int64_t, int64_t, float) { std::abort(); }
void add_rms_norm(Dtype, const void*, void*, const void*, void*, int64_t, int64_t, float) { std::abort(); }
void rotate_heads(Dtype, void*, int64_t, int64_t, int64_t, const float*, const float*) { std::abort(); }
int64_t argmax(const float*, int64_t) { std::abort(); }
void silu_and_mul(Dtype, const void*, void*, int64_t, int64_t, int64_t) { std::abort(); }
double bf16_dot_peak_gflops() { return 0.0; }
bool bf16_gemm_supported() { return false; }
void bf16_gemm(const uint16_t*, int64_t, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t, int64_t) {
  std::abort();
}
void bf16_gemm_silu(const uint16_t*, int64_t, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t, int64_t) {
  std::abort();
}

}  // namespace rtp_llm::ops::avx512

#endif
