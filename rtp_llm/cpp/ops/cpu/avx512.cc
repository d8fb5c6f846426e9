#include "rtp_llm/cpp/ops/cpu/avx512.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
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

// Brings one head row (head_dim elements) into L2 ahead of its use.
template <class E, int C>
inline void prefetch_row(const typename E::T* row) {
  constexpr int kBytes = C * 16 * static_cast<int>(sizeof(typename E::T));
  for (int off = 0; off < kBytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + off, _MM_HINT_T1);
}

// C = head_dim / 16 vectors per head row. Per key and KV head: C loads, group x C FMAs and
// one horizontal sum per query head for the scores, group x C FMAs for the values; the
// softmax runs 16 keys per instruction. Blocks sit anywhere in the pool and a head row is a
// strided 128-256 bytes, which hardware prefetchers do not follow across blocks; without
// software prefetch the loop waits on memory (the KV cache of all layers is far larger than
// the caches).
template <class E, int C>
void attend_impl(const typename E::T* q, const typename E::T* k_cache, const typename E::T* v_cache,
                 const int32_t* block_table, int pos, int kv_head, int num_kv_heads, int group, int block_size,
                 float scale, typename E::T* out, int64_t q_head_stride) {
  constexpr int D = C * 16;
  __m512 qf[kMaxGroup][C], acc[kMaxGroup][C];
  alignas(64) float s[kMaxGroup][kMaxBlockSize];
  alignas(64) float kf[16][C][16];  // 16 keys widened to fp32
  float m[kMaxGroup], l[kMaxGroup];
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int g = 0; g < group; ++g) {
    for (int c = 0; c < C; ++c) {
      qf[g][c] = _mm512_mul_ps(E::load(q + g * q_head_stride + c * 16), vscale);
      acc[g][c] = _mm512_setzero_ps();
    }
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  const int64_t token_stride = int64_t{num_kv_heads} * D;
  const int num_keys = pos + 1;
  for (int start = 0; start < num_keys; start += block_size) {
    const int n = std::min(block_size, num_keys - start);
    const int64_t base = int64_t{block_table[start / block_size]} * block_size * token_stride + int64_t{kv_head} * D;
    const typename E::T* kb = k_cache + base;
    const typename E::T* vb = v_cache + base;
    // Prefetch one block ahead into L2, spread over the loops (a burst of a whole block's rows,
    // or into L1, measured slower): the scores loop fetches the next block's K rows, the
    // values loop its V rows.
    const int next_start = start + block_size;
    const int next_n = std::min(block_size, num_keys - next_start);  // <= 0 on the last block
    const int64_t next_base =
        next_n > 0 ? int64_t{block_table[next_start / block_size]} * block_size * token_stride + int64_t{kv_head} * D
                   : 0;
    if (start == 0) {
      for (int j = 0; j < n; ++j) prefetch_row<E, C>(kb + j * token_stride);
      for (int j = 0; j < n; ++j) prefetch_row<E, C>(vb + j * token_stride);
    }
    // Scores, 16 keys at a time: the keys are widened to fp32 once into kf (L1), then per
    // query head 16 partial-dot vectors are summed by one tree.
    for (int j0 = 0; j0 < n; j0 += 16) {
      const int keys = std::min(16, n - j0);
      for (int j = 0; j < keys; ++j) {
        if (j0 + j < next_n) prefetch_row<E, C>(k_cache + next_base + (j0 + j) * token_stride);
        for (int c = 0; c < C; ++c) _mm512_store_ps(kf[j][c], E::load(kb + (j0 + j) * token_stride + c * 16));
      }
      for (int j = keys; j < 16; ++j) {
        for (int c = 0; c < C; ++c) _mm512_store_ps(kf[j][c], _mm512_setzero_ps());
      }
      for (int g = 0; g < group; ++g) {
        __m512 dot[16];
        for (int j = 0; j < 16; ++j) {
          dot[j] = _mm512_mul_ps(qf[g][0], _mm512_load_ps(kf[j][0]));
          for (int c = 1; c < C; ++c) dot[j] = _mm512_fmadd_ps(qf[g][c], _mm512_load_ps(kf[j][c]), dot[j]);
        }
        _mm512_store_ps(s[g] + j0, sum16(dot));
      }
    }
    for (int g = 0; g < group; ++g) {
      __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int j = 0; j < n; j += 16) vmax = _mm512_mask_max_ps(vmax, tail_mask(n - j), vmax, _mm512_load_ps(s[g] + j));
      const float block_max = std::max(m[g], _mm512_reduce_max_ps(vmax));
      const __m512 bmax = _mm512_set1_ps(block_max);
      __m512 sum = _mm512_setzero_ps();
      for (int j = 0; j < n; j += 16) {
        const __mmask16 mask = tail_mask(n - j);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_load_ps(s[g] + j), bmax));
        _mm512_mask_store_ps(s[g] + j, mask, e);
        sum = _mm512_mask_add_ps(sum, mask, sum, e);
      }
      const float rescale = std::exp(m[g] - block_max);  // 0 for the first block (m = -inf)
      l[g] = l[g] * rescale + _mm512_reduce_add_ps(sum);
      if (rescale != 1.f) {
        const __m512 r = _mm512_set1_ps(rescale);
        for (int c = 0; c < C; ++c) acc[g][c] = _mm512_mul_ps(acc[g][c], r);
      }
      m[g] = block_max;
    }
    for (int j = 0; j < n; ++j) {
      if (j < next_n) prefetch_row<E, C>(v_cache + next_base + j * token_stride);
      __m512 vf[C];
      for (int c = 0; c < C; ++c) vf[c] = E::load(vb + j * token_stride + c * 16);
      for (int g = 0; g < group; ++g) {
        const __m512 p = _mm512_set1_ps(s[g][j]);
        for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(p, vf[c], acc[g][c]);
      }
    }
  }
  for (int g = 0; g < group; ++g) {
    const __m512 inv = _mm512_set1_ps(l[g] > 0.f ? 1.f / l[g] : 0.f);  // no keys (pos < 0): zeros
    for (int c = 0; c < C; ++c) E::store(out + g * q_head_stride + c * 16, _mm512_mul_ps(acc[g][c], inv));
  }
}

template <class E>
void attend_typed(const void* q, const void* k, const void* v, const int32_t* bt, int pos, int kvh, int nkv, int group,
                  int head_dim, int bs, float scale, void* out, int64_t qs) {
  using T = typename E::T;
  const auto* qp = static_cast<const T*>(q);
  const auto* kp = static_cast<const T*>(k);
  const auto* vp = static_cast<const T*>(v);
  auto* op = static_cast<T*>(out);
  switch (head_dim) {
    case 32: return attend_impl<E, 2>(qp, kp, vp, bt, pos, kvh, nkv, group, bs, scale, op, qs);
    case 64: return attend_impl<E, 4>(qp, kp, vp, bt, pos, kvh, nkv, group, bs, scale, op, qs);
    case 128: return attend_impl<E, 8>(qp, kp, vp, bt, pos, kvh, nkv, group, bs, scale, op, qs);
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
  const __m512 one = _mm512_set1_ps(1.f);
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
      const __m512 act = E::round(_mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), g)))));
      E::store(o + i, _mm512_mul_ps(act, E::load(up + i, mask)), mask);
    }
    begin += n;
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

void attend(Dtype dtype, const void* q, const void* k_cache, const void* v_cache, const int32_t* block_table, int pos,
            int kv_head, int num_kv_heads, int group, int head_dim, int block_size, float scale, void* out,
            int64_t q_head_stride) {
  with_type(dtype, [&](auto e) {
    attend_typed<decltype(e)>(q, k_cache, v_cache, block_table, pos, kv_head, num_kv_heads, group, head_dim,
                              block_size, scale, out, q_head_stride);
  });
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
#pragma GCC target("avx512f,avx512bf16")
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
  return threads * static_cast<double>(kIters) * 12 * 32 * 2 * 2 / s / 1e9;  // 32 pairs, 2 FLOP each
}

// MR rows x NB consecutive 16-column blocks of out: an fp32 accumulator per (row, block); per
// pair of k, one 64-byte weight load per block and, per row, the row's two x values broadcast
// into NB `vdpbf16ps`. Decode tiles (NB = 1) stream their block once, from memory, prefetched
// 2 KB ahead; prefill tiles (4 x 4: 4 + 4 loads per 16 `vdpbf16ps`, where 16 x 1 needs 1 + 16)
// re-read their blocks from L2 for every 4 rows of the panel.
template <int MR, int NB>
inline void gemm_tile(const uint16_t* x, int64_t ldx, const uint16_t* wb, int64_t K, uint16_t* out, int64_t ldo) {
  __m512 acc[MR][NB];
  for (int r = 0; r < MR; r++)
    for (int c = 0; c < NB; c++) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 2) {
    __m512bh w[NB];
    for (int c = 0; c < NB; c++) w[c] = (__m512bh)_mm512_loadu_si512(wb + c * K * 16 + k * 16);
    if constexpr (NB == 1) {
      // (An address, not a pointer: it may lie past the buffer's end; prefetches never fault.)
      _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(wb + k * 16) + 2048), _MM_HINT_T0);
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
      int32_t pair;
      std::memcpy(&pair, x + r * ldx + k, sizeof(pair));
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
      for (int c = 0; c < NB; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xb, w[c]);
    }
  }
  for (int r = 0; r < MR; r++)
    for (int c = 0; c < NB; c++)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo + c * 16), (__m256i)_mm512_cvtneps_pbh(acc[r][c]));
}

// Rows [m0, m1) of one 16-column block: the tallest tiles first.
inline void gemm_block_rows(const uint16_t* x, int64_t ldx, const uint16_t* wb, int64_t K, uint16_t* o, int64_t ldo,
                            int64_t m0, int64_t m1) {
  int64_t m = m0;
  for (; m + 16 <= m1; m += 16) gemm_tile<16, 1>(x + m * ldx, ldx, wb, K, o + m * ldo, ldo);
  for (; m + 8 <= m1; m += 8) gemm_tile<8, 1>(x + m * ldx, ldx, wb, K, o + m * ldo, ldo);
  for (; m + 4 <= m1; m += 4) gemm_tile<4, 1>(x + m * ldx, ldx, wb, K, o + m * ldo, ldo);
  for (; m + 2 <= m1; m += 2) gemm_tile<2, 1>(x + m * ldx, ldx, wb, K, o + m * ldo, ldo);
  for (; m < m1; m++) gemm_tile<1, 1>(x + m * ldx, ldx, wb, K, o + m * ldo, ldo);
}

void bf16_gemm_impl(const uint16_t* x, int64_t ldx, const uint16_t* wp, uint16_t* out, int64_t ldo, int64_t M,
                    int64_t N, int64_t K) {
  const int64_t blocks = N / 16;
  if (M <= 16) {
    // Decode batches: each block's weights stream from memory once, for all rows; the
    // threads split the blocks.
    at::parallel_for(0, blocks, 2, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; j++) gemm_block_rows(x, ldx, wp + j * K * 16, K, out + j * 16, ldo, 0, M);
    });
    return;
  }
  // Prefill: panels of rows stay in L2 while groups of 4 blocks stream past; the threads
  // split the groups.
  constexpr int64_t kPanel = 256, kGroup = 4;
  const int64_t groups = blocks / kGroup;
  for (int64_t m0 = 0; m0 < M; m0 += kPanel) {
    const int64_t m1 = std::min(M, m0 + kPanel);
    at::parallel_for(0, groups, 2, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; g++) {
        const uint16_t* wg = wp + g * kGroup * K * 16;
        uint16_t* o = out + g * kGroup * 16;
        int64_t m = m0;
        for (; m + 4 <= m1; m += 4) gemm_tile<4, kGroup>(x + m * ldx, ldx, wg, K, o + m * ldo, ldo);
        for (; m < m1; m++) gemm_tile<1, kGroup>(x + m * ldx, ldx, wg, K, o + m * ldo, ldo);
      }
    });
    at::parallel_for(groups * kGroup, blocks, 1, [&](int64_t begin, int64_t end) {  // the last < 4 blocks
      for (int64_t j = begin; j < end; j++) gemm_block_rows(x, ldx, wp + j * K * 16, K, out + j * 16, ldo, m0, m1);
    });
  }
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
  static const bool ok = !disabled_by_env() && __builtin_cpu_supports("avx512f") &&
                         __builtin_cpu_supports("avx512bf16");
  return ok;
}

void bf16_gemm(const uint16_t* x, int64_t ldx, const uint16_t* w_packed, uint16_t* out, int64_t ldo, int64_t M,
               int64_t N, int64_t K) {
  if (!bf16_gemm_supported()) std::abort();  // callers check bf16_gemm_supported()
  bf16_gemm_impl(x, ldx, w_packed, out, ldo, M, N, K);
}

}  // namespace rtp_llm::ops::avx512

#else  // not x86_64: the portable kernels run

namespace rtp_llm::ops::avx512 {

bool supported() { return false; }
std::optional<Dtype> usable_for(c10::ScalarType) { return std::nullopt; }
bool attention_supports(int, int, int) { return false; }
void attend(Dtype, const void*, const void*, const void*, const int32_t*, int, int, int, int, int, int, float, void*,
            int64_t) {
  std::abort();
}
void rms_norm(Dtype, const void*, const void*, void*, int64_t, int64_t, float) { std::abort(); }
void add_rms_norm(Dtype, const void*, void*, const void*, void*, int64_t, int64_t, float) { std::abort(); }
void silu_and_mul(Dtype, const void*, void*, int64_t, int64_t, int64_t) { std::abort(); }
double bf16_dot_peak_gflops() { return 0.0; }
bool bf16_gemm_supported() { return false; }
void bf16_gemm(const uint16_t*, int64_t, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t, int64_t) {
  std::abort();
}

}  // namespace rtp_llm::ops::avx512

#endif
