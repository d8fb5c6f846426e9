// AVX-512 VNNI kernels of the Q4_K / Q5_K / Q6_K projections (kquant.h). The packed weights are
// the unsigned operand of `vpdpbusd` (4-bit nibbles, 5-bit quants with a masked add of 16 from
// the bit plane, or 6-bit quants rebuilt from a nibble and two high bits), the activations' int8
// the signed one, so no offset is needed; per sub-block and 16
// columns one int32 sum, multiplied by the columns' sub-block scales into an int32 per
// super-block (exact, kquant.h's bounds), then scaled into fp32 as the portable kernel does.
// Row tiles of up to 4 rows share each weight load and its unpacking. Called by
// kquant_linear.cc where q8_0_vnni_supported().
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>

#include "rtp_llm/cpp/ops/cpu/avx512.h"
#include "rtp_llm/cpp/ops/cpu/kquant.h"
#include "rtp_llm/cpp/ops/cpu/q8_0.h"

#if defined(__x86_64__)
#include "rtp_llm/cpp/ops/cpu/avx512_simd.h"

RTP_LLM_AVX512_VNNI_BEGIN
namespace rtp_llm::ops::avx512 {
namespace {

using namespace kquant;

// Per row: the sub-block sum, the super-block sums and the fp32 accumulator stay in registers
// (4 to 5 per row): 4 rows leave room for the weight vectors being unpacked.
constexpr int kMaxTileRows = 4;

// A tile's rows of the quantized activations: row r's int8 at q + r * K, its super-block scales
// at d + r * nb and 16-sums at sums + r * nb * 16.
struct Rows {
  const int8_t* q;
  const float* d;
  const int32_t* sums;
  int64_t K, nb;
};

inline __m512i quad(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

inline void prefetch_record(const uint8_t* rec, int bytes) {
  // (An address, not a pointer: it may lie past the buffer's end; prefetches never fault.)
  const uintptr_t next = reinterpret_cast<uintptr_t>(rec) + bytes;
  for (int l = 0; l < bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(next + l), _MM_HINT_T0);
}

inline __m512 fp16x16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// Q4_K (F = kQ4K) and Q5_K (kQ5K, the 5th bits added from the record's bit plane).
template <int MR, Format F>
void sub_scaled_tile(const Rows& x, const uint8_t* wg, float* out, int64_t ldo, __mmask16 cols) {
  constexpr SubScaledRecord R = F == Format::kQ5K ? kQ5KRecord : kQ4KRecord;
  __m512 acc[MR];
  for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < x.nb; b++) {
    const uint8_t* rec = wg + b * R.bytes;
    prefetch_record(rec, R.bytes);
    __m512i s1[MR], s2[MR];
    for (int r = 0; r < MR; r++) s1[r] = s2[r] = _mm512_setzero_si512();
    for (int j = 0; j < kQ4KSubs; j++) {
      __m512i s[MR];
      for (int r = 0; r < MR; r++) s[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int t = 0; t < 4; t++) {
        __m512i lo, hi;
        split_nibbles(_mm512_loadu_si512(rec + 64 * (4 * j + t)), lo, hi);
        if constexpr (R.high >= 0) {
          lo = add_fifth_bits(lo, rec + R.high + 16 * (4 * j + t));
          hi = add_fifth_bits(hi, rec + R.high + 16 * (4 * j + t) + 8);
        }
        for (int r = 0; r < MR; r++) {
          const int8_t* xq = x.q + r * x.K + b * kSuper + kQ4KSub * j + 8 * t;
          s[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s[r], lo, quad(xq)), hi, quad(xq + 4));
        }
      }
      const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + R.scales + 16 * j)));
      const __m512i mn = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + R.mins + 16 * j)));
      for (int r = 0; r < MR; r++) {
        const int32_t* sums = x.sums + (r * x.nb + b) * kSumsPerSuper + 2 * j;
        s1[r] = _mm512_add_epi32(s1[r], _mm512_mullo_epi32(s[r], sc));
        s2[r] = _mm512_add_epi32(s2[r], _mm512_mullo_epi32(mn, _mm512_set1_epi32(sums[0] + sums[1])));
      }
    }
    const __m512 dw = fp16x16(rec + R.d), dm = fp16x16(rec + R.dmin);
    for (int r = 0; r < MR; r++) {
      const __m512 dx = _mm512_set1_ps(x.d[r * x.nb + b]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[r]), _mm512_mul_ps(dw, dx), acc[r]);
      acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(s2[r]), _mm512_mul_ps(dm, dx), acc[r]);
    }
  }
  for (int r = 0; r < MR; r++) _mm512_mask_storeu_ps(out + r * ldo, cols, acc[r]);
}

// The 6-bit quants of sub-block u's four quads: nibble | (2 high bits << 4). The 16-bit shifts
// carry bits across bytes; the 0x30 mask keeps only each byte's own field.
struct Q6Quads {
  __m512i q[4];
};

inline Q6Quads q6_k_quads(const uint8_t* rec, int u) {
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  const __m512i h = _mm512_loadu_si512(rec + kQ6KHighOffset + 64 * u);
  Q6Quads o;
  split_nibbles(_mm512_loadu_si512(rec + 64 * (2 * u)), o.q[0], o.q[1]);
  split_nibbles(_mm512_loadu_si512(rec + 64 * (2 * u + 1)), o.q[2], o.q[3]);
  o.q[0] = _mm512_or_si512(o.q[0], _mm512_and_si512(_mm512_slli_epi16(h, 4), bits45));
  o.q[1] = _mm512_or_si512(o.q[1], _mm512_and_si512(_mm512_slli_epi16(h, 2), bits45));
  o.q[2] = _mm512_or_si512(o.q[2], _mm512_and_si512(h, bits45));
  o.q[3] = _mm512_or_si512(o.q[3], _mm512_and_si512(_mm512_srli_epi16(h, 2), bits45));
  return o;
}

template <int MR>
void q6_k_tile(const Rows& x, const uint8_t* wg, float* out, int64_t ldo, __mmask16 cols) {
  __m512 acc[MR];
  for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < x.nb; b++) {
    const uint8_t* rec = wg + b * kQ6KRecordBytes;
    prefetch_record(rec, kQ6KRecordBytes);
    __m512i total[MR];
    for (int r = 0; r < MR; r++) total[r] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int u = 0; u < kQ6KSubs; u++) {
      const Q6Quads w = q6_k_quads(rec, u);
      const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + kQ6KScalesOffset + 16 * u)));
      for (int r = 0; r < MR; r++) {
        const int8_t* xq = x.q + r * x.K + b * kSuper + kQ6KSub * u;
        __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.q[0], quad(xq));
        s = _mm512_dpbusd_epi32(s, w.q[1], quad(xq + 4));
        s = _mm512_dpbusd_epi32(s, w.q[2], quad(xq + 8));
        s = _mm512_dpbusd_epi32(s, w.q[3], quad(xq + 12));
        const int32_t bias = kQ6KBias * x.sums[(r * x.nb + b) * kSumsPerSuper + u];
        total[r] = _mm512_add_epi32(total[r], _mm512_mullo_epi32(_mm512_sub_epi32(s, _mm512_set1_epi32(bias)), sc));
      }
    }
    const __m512 dw = fp16x16(rec + kQ6KDOffset);
    for (int r = 0; r < MR; r++)
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[r]), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[r * x.nb + b])), acc[r]);
  }
  for (int r = 0; r < MR; r++) _mm512_mask_storeu_ps(out + r * ldo, cols, acc[r]);
}

using Tile = void (*)(const Rows&, const uint8_t*, float*, int64_t, __mmask16);

template <Format F, int... MR>
constexpr std::array<Tile, sizeof...(MR)> sub_scaled_tiles(std::integer_sequence<int, MR...>) {
  return {&sub_scaled_tile<MR + 1, F>...};
}

template <int... MR>
constexpr std::array<Tile, sizeof...(MR)> q6_k_tiles(std::integer_sequence<int, MR...>) {
  return {&q6_k_tile<MR + 1>...};
}

void gemm_impl(Format f, const Gemm& g) {
  const int64_t nb = g.K / kSuper, groups = (g.N + kGroupCols - 1) / kGroupCols;
  const int record = record_bytes(f);
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xd;
  thread_local std::vector<int32_t> xs;
  if (static_cast<int64_t>(xq.size()) < g.M * g.K) xq.resize(g.M * g.K);
  if (static_cast<int64_t>(xd.size()) < g.M * nb) xd.resize(g.M * nb);
  if (static_cast<int64_t>(xs.size()) < g.M * nb * kSumsPerSuper) xs.resize(g.M * nb * kSumsPerSuper);
  // Plain pointers for the lambda: on torch's worker threads the thread_local names are theirs.
  const Activations a{xq.data(), xd.data(), xs.data()};
  quantize_activations(g.x, g.ldx, g.M, g.K, a);
  static constexpr auto kQ4K = sub_scaled_tiles<Format::kQ4K>(std::make_integer_sequence<int, kMaxTileRows>{});
  static constexpr auto kQ5K = sub_scaled_tiles<Format::kQ5K>(std::make_integer_sequence<int, kMaxTileRows>{});
  static constexpr auto kQ6K = q6_k_tiles(std::make_integer_sequence<int, kMaxTileRows>{});
  const auto& tiles = f == Format::kQ4K ? kQ4K : f == Format::kQ5K ? kQ5K : kQ6K;
  const int64_t panels = (g.M + kPanelRows - 1) / kPanelRows;
  at::parallel_for(0, panels * groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; unit++) {
      const int64_t grp = unit % groups, m0 = unit / groups * kPanelRows, m1 = std::min(g.M, m0 + kPanelRows);
      const __mmask16 cols = tail_mask(g.N - grp * kGroupCols);
      const uint8_t* wg = g.w + grp * nb * record;
      float* o = g.out + grp * kGroupCols;
      for (int64_t m = m0; m < m1; m += kMaxTileRows) {
        const int64_t rows = std::min<int64_t>(kMaxTileRows, m1 - m);
        const Rows x{a.q + m * g.K, a.d + m * nb, a.sums + m * nb * kSumsPerSuper, g.K, nb};
        tiles[rows - 1](x, wg, o + m * g.ldo, g.ldo, cols);
      }
    }
  });
}

}  // namespace
}  // namespace rtp_llm::ops::avx512
RTP_LLM_AVX512_END

namespace rtp_llm::ops::avx512 {

void kquant_gemm(kquant::Format f, const kquant::Gemm& g) {
  if (!q8_0_vnni_supported()) std::abort();  // callers check q8_0_vnni_supported()
  gemm_impl(f, g);
}

}  // namespace rtp_llm::ops::avx512

#else  // not x86_64: the portable kernel runs

namespace rtp_llm::ops::avx512 {

void kquant_gemm(kquant::Format, const kquant::Gemm&) { std::abort(); }

}  // namespace rtp_llm::ops::avx512

#endif
