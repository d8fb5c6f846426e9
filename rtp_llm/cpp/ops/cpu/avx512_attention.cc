// AVX-512 paged attention: one item (a query token and a range of its KV heads) over the
// stream's K/V blocks, online softmax in fp32, the blocks prefetched ahead of their use.
// Called by paged_attention.cc where avx512::usable_for() and attention_supports() say so.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "rtp_llm/cpp/ops/cpu/avx512.h"

#if defined(__x86_64__)
#include "rtp_llm/cpp/ops/cpu/avx512_kv_prefetch.h"
#include "rtp_llm/cpp/ops/cpu/avx512_simd.h"

namespace rtp_llm::ops::avx512 {
namespace {
constexpr int kMaxGroup = 16;      // query heads per KV head
constexpr int kMaxBlockSize = 64;  // tokens per KV block
}  // namespace
}  // namespace rtp_llm::ops::avx512

RTP_LLM_AVX512_BEGIN

namespace rtp_llm::ops::avx512 {

namespace {

RTP_LLM_AVX512_BF16_BEGIN
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
// the instructions of widening V and an FMA per key: a gain from cache, none from memory,
// where the K/V stream bounds the decode.
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

RTP_LLM_AVX512_END

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

// The query heads of one item (C = head_dim / 16 vectors per head row): scaled by the softmax
// scale, their value accumulators and online-softmax max and sum, fp32. Head kvh * group + g
// is KV head kvh's g-th query head.
template <int C>
struct ItemState {
  __m512 qf[kMaxItemHeads][C], acc[kMaxItemHeads][C];
  float m[kMaxItemHeads], l[kMaxItemHeads];
};

template <class E, int C>
[[gnu::always_inline]] inline void start_item(const typename E::T* q, int64_t q_head_stride, int heads, float scale,
                                              ItemState<C>& st) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int h = 0; h < heads; ++h) {
    for (int c = 0; c < C; ++c) {
      st.qf[h][c] = _mm512_mul_ps(E::load(q + h * q_head_stride + c * 16), vscale);
      st.acc[h][c] = _mm512_setzero_ps();
    }
    st.m[h] = -std::numeric_limits<float>::infinity();
    st.l[h] = 0.f;
  }
}

// Scores of one KV head's `group` query heads qg against 16 keys at kb (rows token_stride
// apart; `keys` of them real, 0 beyond): the keys are widened to fp32 once into kf (L1), then
// per query head 16 partial-dot vectors are summed by one tree. s[g] + j0 gets head g's.
template <class E, int C>
[[gnu::always_inline]] inline void scores16_widened(const __m512 (*qg)[C], int group, const typename E::T* kb,
                                                    int64_t token_stride, int keys, float (*s)[kMaxBlockSize],
                                                    int j0, PrefetchQueue& pq) {
  alignas(64) float kf[16][C][16];  // 16 keys widened to fp32
  for (int j = 0; j < keys; ++j) {
    pq.pump();
    for (int c = 0; c < C; ++c) _mm512_store_ps(kf[j][c], E::load(kb + j * token_stride + c * 16));
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

// s[g][j] = the scaled score of one KV head's query head g (q: its first, q_head_stride
// apart; qg: them scaled, fp32) against key j < n of the block at kb, 16 keys at a time (bf16
// rows with AVX512-BF16: `vdpbf16ps` on them as stored, scores16_bf16, ~2x fewer instructions).
template <class E, int C>
[[gnu::always_inline]] inline void block_scores(const typename E::T* q, int64_t q_head_stride, const __m512 (*qg)[C],
                                                int group, const typename E::T* kb, int64_t token_stride, int n,
                                                float scale, bool bf16_dot, float (*s)[kMaxBlockSize],
                                                PrefetchQueue& pq) {
  for (int j0 = 0; j0 < n; j0 += 16) {
    const int keys = std::min(16, n - j0);
    if constexpr (std::is_same_v<E, BF16>) {
      if (bf16_dot) {
        // (Without lines to prefetch, a copy without the pumps: prompts' items run from
        // cache, compute-bound.)
        (pq.empty() ? scores16_bf16<C / 2, false> : scores16_bf16<C / 2, true>)(
            q, q_head_stride, group, kb + j0 * token_stride, token_stride, keys, scale, &s[0][j0], kMaxBlockSize, pq);
        continue;
      }
    }
    scores16_widened<E, C>(qg, group, kb + j0 * token_stride, token_stride, keys, s, j0, pq);
  }
}

// Online softmax over one KV head's block of n scores: s[g][j] becomes exp(s - the new max);
// each head's sum l is rescaled to the new max and adds the block's, its accumulator acc is
// rescaled, and m becomes the new max.
template <int C>
[[gnu::always_inline]] inline void softmax_block(float (*s)[kMaxBlockSize], int n, int group, float* mg, float* lg,
                                                 __m512 (*ag)[C]) {
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
}

// ag[g] += sum_j s[g][j] v_j over the block's n V rows at vb (token_stride apart): the rows
// widened once into vf (L1), then per query head register accumulators over the block, even
// and odd keys apart (2C FMA chains).
template <class E, int C>
[[gnu::always_inline]] inline void values_widened(const typename E::T* vb, int64_t token_stride, int n,
                                                  const float (*s)[kMaxBlockSize], int group, __m512 (*ag)[C],
                                                  PrefetchQueue& pq) {
  alignas(64) float vf[kMaxBlockSize][C][16];  // the block's V rows widened to fp32
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

// ag[g] += the block's values weighted by s[g] (bf16 rows with AVX512-BF16: values_bf16).
template <class E, int C>
[[gnu::always_inline]] inline void block_values(const typename E::T* vb, int64_t token_stride, int n,
                                                float (*s)[kMaxBlockSize], int group, bool bf16_dot, __m512 (*ag)[C],
                                                PrefetchQueue& pq) {
  if constexpr (std::is_same_v<E, BF16>) {
    if (bf16_dot) {
      (pq.empty() ? values_bf16<C, false> : values_bf16<C, true>)(vb, token_stride, n, s[0], kMaxBlockSize, group,
                                                                  &ag[0][0], pq);
      return;
    }
  }
  values_widened<E, C>(vb, token_stride, n, s, group, ag, pq);
}

// out = acc / l per query head (values_bf16's accumulators first back in the dims' order).
template <class E, int C>
[[gnu::always_inline]] inline void finish_item(typename E::T* out, int64_t q_head_stride, int heads, bool bf16_rows,
                                               ItemState<C>& st) {
  if (bf16_rows) unpermute_values<C>(st.acc, heads);
  for (int h = 0; h < heads; ++h) {
    const __m512 inv = _mm512_set1_ps(st.l[h] > 0.f ? 1.f / st.l[h] : 0.f);  // no keys (pos < 0): zeros
    for (int c = 0; c < C; ++c) E::store(out + h * q_head_stride + c * 16, _mm512_mul_ps(st.acc[h][c], inv));
  }
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
  const bool bf16_rows = bf16_dot && std::is_same_v<E, BF16>;
  const T* q = static_cast<const T*>(it.q);
  const int group = sh.group, block_size = sh.block_size, kv_heads = it.kv_head_end - it.kv_head_begin;
  const int heads = kv_heads * group;  // query heads of the item, <= kMaxItemHeads
  const int64_t q_head_stride = sh.q_head_stride, token_stride = int64_t{sh.num_kv_heads} * D;
  ItemState<C> st;
  start_item<E, C>(q, q_head_stride, heads, sh.scale, st);
  alignas(64) float s[kMaxGroup][kMaxBlockSize];
  const int num_keys = it.pos + 1;
  const int blocks = (num_keys + block_size - 1) / block_size;
  if (first && it.prefetch) {
    for (int b = 0; b < kBlocksAhead; ++b) prefetch_queue(k_cache, v_cache, sh, block_rows<T>(sh, it, b), 1).drain();
  }
  for (int start = 0; start < num_keys; start += block_size) {
    const int n = std::min(block_size, num_keys - start);
    const int64_t block =
        int64_t{it.block_table[start / block_size]} * block_size * token_stride + int64_t{it.kv_head_begin} * D;
    PrefetchQueue pq = block_prefetch(k_cache, v_cache, sh, it, next, start / block_size, blocks, n, bf16_rows);
    for (int kvh = 0; kvh < kv_heads; ++kvh) {
      const int h0 = kvh * group;  // the KV head's first query head in the item
      block_scores<E, C>(q + h0 * q_head_stride, q_head_stride, st.qf + h0, group, k_cache + block + kvh * D,
                         token_stride, n, sh.scale, bf16_dot, s, pq);
      softmax_block<C>(s, n, group, st.m + h0, st.l + h0, st.acc + h0);
      block_values<E, C>(v_cache + block + kvh * D, token_stride, n, s, group, bf16_dot, st.acc + h0, pq);
    }
    pq.drain();  // what the pumps left (a fuller block than this one: the next item's)
  }
  finish_item<E, C>(static_cast<T*>(it.out), q_head_stride, heads, bf16_rows, st);
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

}  // namespace

void attend(Dtype dtype, const void* k_cache, const void* v_cache, const AttendShape& shape, const AttendItem& item,
            const AttendItem* next, bool first) {
  with_type(dtype, [&](auto e) { attend_typed<decltype(e)>(k_cache, v_cache, shape, item, next, first); });
}

}  // namespace rtp_llm::ops::avx512

RTP_LLM_AVX512_END

// Compiled for the baseline ISA, outside the AVX-512 region above.
namespace rtp_llm::ops::avx512 {

bool attention_supports(int head_dim, int group, int block_size) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128) && group <= kMaxGroup &&
         block_size <= kMaxBlockSize;
}

}  // namespace rtp_llm::ops::avx512

#else  // not x86_64: the portable kernels run

namespace rtp_llm::ops::avx512 {

bool attention_supports(int, int, int) { return false; }
void attend(Dtype, const void*, const void*, const AttendShape&, const AttendItem&, const AttendItem*, bool) {
  std::abort();
}

}  // namespace rtp_llm::ops::avx512

#endif
