// AVX512-BF16 GEMM of the bf16 projections (`vdpbf16ps`): decode tiles for up to
// kMaxDecodeRows rows (each weight block streamed once for all rows), prefill panels of 4-row
// tiles, with a plain bf16 store or the MLP's SiLU-and-mul as the epilogue; and the cores'
// bf16 peak, a roof for benchmarks. Called by bf16_linear.cc where bf16_gemm_supported().
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>

#include "rtp_llm/cpp/ops/cpu/avx512.h"

#if defined(__x86_64__)
#include "rtp_llm/cpp/ops/cpu/avx512_simd.h"

RTP_LLM_AVX512_BF16_BEGIN
namespace rtp_llm::ops::avx512 {
namespace {

constexpr int kMaxDecodeRows = 16;  // GEMM rows that run as decode tiles (one accumulator each)

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
// the cores' full bf16 peak and the memory stream at once; the one pointer beat 8-row pointer
// tiles (two passes) and 16 spilled pointers on Qwen2.5-0.5B's decode step (readings in
// docs/benchmarks.md).
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
// 2p, 2p + 1; 16 pairs at a time through one register transpose.
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
RTP_LLM_AVX512_END

// Run on every CPU: compiled for the baseline ISA, outside the AVX-512 region above.
namespace rtp_llm::ops::avx512 {

double bf16_dot_peak_gflops() {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) return 0.0;
  return bf16_dot_peak_measure(at::get_num_threads());
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

double bf16_dot_peak_gflops() { return 0.0; }
void bf16_gemm(const uint16_t*, int64_t, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t, int64_t) {
  std::abort();
}
void bf16_gemm_silu(const uint16_t*, int64_t, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t, int64_t) {
  std::abort();
}

}  // namespace rtp_llm::ops::avx512

#endif
