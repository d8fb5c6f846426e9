// The vector pieces every AVX-512 kernel file (avx512_attention.cc, avx512_gemm.cc,
// avx512_row_ops.cc) builds on: masks, the storage types' loads and stores, exp and silu, a
// 16-vector horizontal sum, and the dtype dispatch. x86_64 only; internal linkage (each file
// inlines its own copies, as when the kernels were one file).
//
// Only this header's own code is compiled for AVX-512: the headers it includes keep their
// baseline code, so no inline function of theirs is emitted with AVX-512 instructions (the
// linker could keep that copy for the whole library).
#pragma once

#if !defined(__x86_64__)
#error "avx512_simd.h is x86_64 only"
#endif

#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "rtp_llm/cpp/ops/cpu/avx512.h"

// The region each AVX-512 file compiles its own code in: AVX-512 F, BW, DQ, VL (_BF16: and
// AVX512-BF16, for `vdpbf16ps`). GCC 12's intrinsics start some results from a
// self-initialized `_mm512_undefined_*()` (`_mm512_set1_epi16`: an uninitialized one), which
// -Wmaybe-uninitialized (-Wuninitialized) reports once inlined: false positives.
#define RTP_LLM_AVX512_BEGIN \
  _Pragma("GCC push_options") \
  _Pragma("GCC target(\"avx512f,avx512bw,avx512dq,avx512vl\")") \
  _Pragma("GCC diagnostic push") \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define RTP_LLM_AVX512_BF16_BEGIN \
  _Pragma("GCC push_options") \
  _Pragma("GCC target(\"avx512f,avx512bw,avx512dq,avx512vl,avx512bf16\")") \
  _Pragma("GCC diagnostic push") \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define RTP_LLM_AVX512_VNNI_BEGIN \
  _Pragma("GCC push_options") \
  _Pragma("GCC target(\"avx512f,avx512bw,avx512dq,avx512vl,avx512vnni\")") \
  _Pragma("GCC diagnostic push") \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define RTP_LLM_AVX512_END _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")

RTP_LLM_AVX512_BEGIN

namespace rtp_llm::ops::avx512 {
namespace {  // NOLINT(google-build-namespaces): see above

inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << remaining) - 1);
}

// Packed quants (q8_0.h's narrow records, kquant.h's): a 64-byte chunk of nibbles as two
// `vpdpbusd` operands, its bytes' low nibbles and their high nibbles.
inline void split_nibbles(__m512i chunk, __m512i& lo, __m512i& hi) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  lo = _mm512_and_si512(chunk, low4);
  hi = _mm512_and_si512(_mm512_srli_epi16(chunk, 4), low4);
}

// An operand's quants plus 16 in each byte whose bit is set in the little-endian uint64 at
// `plane` (the 5th-bit planes of Q5_0 / Q5_1 / Q5_K records: bit i, byte i).
inline __m512i add_fifth_bits(__m512i q, const uint8_t* plane) {
  uint64_t bits;
  std::memcpy(&bits, plane, sizeof(bits));
  return _mm512_mask_add_epi8(q, _cvtu64_mask64(bits), q, _mm512_set1_epi8(16));
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
}  // namespace rtp_llm::ops::avx512

RTP_LLM_AVX512_END
