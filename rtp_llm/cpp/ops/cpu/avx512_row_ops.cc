// AVX-512 row kernels: RMSNorm (after a residual add or not), rotary of a token's heads,
// SiLU-and-mul, the rows' argmax and a grammar mask's bans. Called by rms_norm.cc and fused_ops.cc where
// avx512::usable_for() says so.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "rtp_llm/cpp/ops/cpu/avx512.h"

#if defined(__x86_64__)
#include "rtp_llm/cpp/ops/cpu/avx512_simd.h"

RTP_LLM_AVX512_BEGIN

namespace rtp_llm::ops::avx512 {

namespace {

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

}  // namespace

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

void ban_unset_bits(float* row, const uint32_t* mask, int64_t n) {
  const __m512 banned = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < n; t += 32) {
    const uint32_t word = mask[t / 32];
    if (word == 0xffffffffu) continue;
    const int64_t left = n - t;  // (> 0; masked-off lanes past the row are never touched)
    const __mmask16 lo = static_cast<__mmask16>(~word) & tail_mask(left);
    const __mmask16 hi = left > 16 ? static_cast<__mmask16>(~word >> 16) & tail_mask(left - 16) : 0;
    _mm512_mask_storeu_ps(row + t, lo, banned);
    _mm512_mask_storeu_ps(row + t + 16, hi, banned);
  }
}

void silu_and_mul(Dtype dtype, const void* x, void* out, int64_t inter, int64_t begin, int64_t end) {
  with_type(dtype, [&](auto e) {
    using T = typename decltype(e)::T;
    silu_and_mul_range<decltype(e)>(static_cast<const T*>(x), static_cast<T*>(out), inter, begin, end);
  });
}

}  // namespace rtp_llm::ops::avx512

RTP_LLM_AVX512_END

#else  // not x86_64: the portable kernels run

namespace rtp_llm::ops::avx512 {

void rms_norm(Dtype, const void*, const void*, void*, int64_t, int64_t, float) { std::abort(); }
void add_rms_norm(Dtype, const void*, void*, const void*, void*, int64_t, int64_t, float) { std::abort(); }
void rotate_heads(Dtype, void*, int64_t, int64_t, int64_t, const float*, const float*) { std::abort(); }
int64_t argmax(const float*, int64_t) { std::abort(); }
void ban_unset_bits(float*, const uint32_t*, int64_t) { std::abort(); }
void silu_and_mul(Dtype, const void*, void*, int64_t, int64_t, int64_t) { std::abort(); }

}  // namespace rtp_llm::ops::avx512

#endif
