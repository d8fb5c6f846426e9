// AVX-512 VNNI kernel of the 32-block formats' projections (q8_0.h: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1):
// activations quantized per row and 32-block to int8 on the fly (llama.cpp's q8_0 x q8_0 dot),
// offset by +128 so they are the unsigned operand of `vpdpbusd` (the packed weights' per-block
// sums take the offset back out, exactly); per block and 16 columns one int32 sum, scaled by the
// weight's and the activation's scales into an fp32 accumulator; records with a min add m x the
// activation block's sum of q. A narrow record's 64-byte chunk becomes two operands in registers
// (nibbles masked and shifted; the 5th bits added from a mask register; the zero point taken
// off). Row tiles of up to 8 rows share each weight operand. Called by q8_0_linear.cc where
// q8_0_vnni_supported().
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>

#include "rtp_llm/cpp/ops/cpu/avx512.h"
#include "rtp_llm/cpp/ops/cpu/q8_0.h"

#if defined(__x86_64__)
#include "rtp_llm/cpp/ops/cpu/avx512_simd.h"

RTP_LLM_AVX512_VNNI_BEGIN
namespace rtp_llm::ops::avx512 {
namespace {

using q8_0::Format;
using q8_0::kBlock;
using q8_0::kOperandBytes;
using q8_0::Record;

constexpr int kMaxTileRows = 8;  // int32 + fp32 accumulators per row: 16 of 32 registers at 8

// One row of x (K floats) -> q + 128 as bytes [K], the scales d [K / 32] and the blocks' sums of
// q, xs [K / 32]: the portable kernel's quantize_row exactly (max |x| and the integer sums are
// order-free; x * (1 / d) and round-to-nearest-even by `vcvtps2dq` under the default MXCSR, as
// nearbyint).
inline void quantize_row_u8(const float* x, int64_t K, uint8_t* q, float* d, int32_t* xs) {
  const __m512i offset = _mm512_set1_epi32(128);
  for (int64_t b = 0; b < K / kBlock; b++) {
    const __m512 a0 = _mm512_loadu_ps(x + b * kBlock), a1 = _mm512_loadu_ps(x + b * kBlock + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
    const float db = amax / q8_0::kQMax;
    const __m512 id = _mm512_set1_ps(db != 0.f ? 1.f / db : 0.f);
    const __m512i s0 = _mm512_cvtps_epi32(_mm512_mul_ps(a0, id)), s1 = _mm512_cvtps_epi32(_mm512_mul_ps(a1, id));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kBlock), _mm512_cvtepi32_epi8(_mm512_add_epi32(s0, offset)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kBlock + 16), _mm512_cvtepi32_epi8(_mm512_add_epi32(s1, offset)));
    d[b] = db;
    xs[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(s0, s1));
  }
}

// A tile's rows of the quantized activations: row r's q + 128 at q + r * K, its block scales at
// d + r * nb and sums of q at xs + r * nb.
struct Rows {
  const uint8_t* q;
  const float* d;
  const int32_t* xs;
  int64_t K, nb;
};

// Accumulates operand t (64 bytes of int8 q, [16 columns][4]) against the MR rows' quad t of block b.
template <int MR>
[[gnu::always_inline]] inline void dot(const Rows& x, int64_t b, int t, __m512i w, __m512i* s) {
  for (int r = 0; r < MR; r++) {
    int32_t quad;
    std::memcpy(&quad, x.q + r * x.K + b * kBlock + 4 * t, sizeof(quad));
    s[r] = _mm512_dpbusd_epi32(s[r], _mm512_set1_epi32(quad), w);
  }
}

// Block b's integer sums: the 8 operands as stored (8 bits) or unpacked from 4 chunks of nibbles
// (q8_0.h), their 5th bits from the bit plane, less the zero point.
template <int MR, Format F>
[[gnu::always_inline]] inline void block_sums(const Rows& x, int64_t b, const uint8_t* rec, __m512i* s) {
  constexpr Record R = q8_0::record_of(F);
  if constexpr (R.bits == 8) {
#pragma GCC unroll 8
    for (int t = 0; t < q8_0::kQuadsPerBlock; t++) dot<MR>(x, b, t, _mm512_loadu_si512(rec + kOperandBytes * t), s);
  } else {
    const __m512i zero = _mm512_set1_epi8(R.zero);
#pragma GCC unroll 4
    for (int j = 0; j < q8_0::kQuadsPerBlock / 2; j++) {
      __m512i w[2];
      split_nibbles(_mm512_loadu_si512(rec + kOperandBytes * j), w[0], w[1]);
      for (int h = 0; h < 2; h++) {
        if constexpr (R.bits == 5) w[h] = add_fifth_bits(w[h], rec + q8_0::kNibbleBytes + 8 * (2 * j + h));
        if constexpr (R.zero != 0) w[h] = _mm512_sub_epi8(w[h], zero);
        dot<MR>(x, b, 2 * j + h, w[h], s);
      }
    }
  }
}

// MR rows x one group's nb packed records of format F -> out's 16 columns (`cols`: those that
// exist). Records stream once per tile, prefetched 4 ahead.
template <int MR, Format F>
void tile(const Rows& x, const uint8_t* wg, float* out, int64_t ldo, __mmask16 cols) {
  constexpr Record R = q8_0::record_of(F);
  const int64_t nb = x.nb;
  __m512 acc[MR];
  for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* rec = wg + b * R.bytes;
    // (An address, not a pointer: it may lie past the buffer's end; prefetches never fault.)
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(rec) + 4 * R.bytes;
    for (int l = 0; l < R.bytes / 64; l++) _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * l), _MM_HINT_T0);
    __m512i s[MR];
    for (int r = 0; r < MR; r++) s[r] = _mm512_setzero_si512();
    block_sums<MR, F>(x, b, rec, s);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + R.scales)));
    const __m512i comp =
        _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + R.sums))), 7);
    for (int r = 0; r < MR; r++)
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s[r], comp)),
                               _mm512_mul_ps(dw, _mm512_set1_ps(x.d[r * nb + b])), acc[r]);
    if constexpr (R.mins >= 0) {
      const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + R.mins)));
      for (int r = 0; r < MR; r++)
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_set1_epi32(x.xs[r * nb + b])),
                                 _mm512_mul_ps(dm, _mm512_set1_ps(x.d[r * nb + b])), acc[r]);
    }
  }
  for (int r = 0; r < MR; r++) _mm512_mask_storeu_ps(out + r * ldo, cols, acc[r]);
}

using Tile = void (*)(const Rows&, const uint8_t*, float*, int64_t, __mmask16);

template <Format F, int... MR>
constexpr std::array<Tile, sizeof...(MR)> tiles(std::integer_sequence<int, MR...>) {
  return {&tile<MR + 1, F>...};
}

// Tile functions by row count (1 .. kMaxTileRows) for a format.
const std::array<Tile, kMaxTileRows>& tiles_of(Format f) {
  using Rows8 = std::make_integer_sequence<int, kMaxTileRows>;
  static constexpr auto kQ8_0 = tiles<Format::kQ8_0>(Rows8{}), kQ4_0 = tiles<Format::kQ4_0>(Rows8{}),
                        kQ4_1 = tiles<Format::kQ4_1>(Rows8{}), kQ5_0 = tiles<Format::kQ5_0>(Rows8{}),
                        kQ5_1 = tiles<Format::kQ5_1>(Rows8{});
  switch (f) {
    case Format::kQ4_0: return kQ4_0;
    case Format::kQ4_1: return kQ4_1;
    case Format::kQ5_0: return kQ5_0;
    case Format::kQ5_1: return kQ5_1;
    default: return kQ8_0;
  }
}

void gemm_impl(const q8_0::Gemm& g) {
  const int64_t nb = g.K / kBlock, groups = (g.N + q8_0::kGroupCols - 1) / q8_0::kGroupCols;
  thread_local std::vector<uint8_t> xq;
  thread_local std::vector<float> xd;
  thread_local std::vector<int32_t> xsum;
  if (static_cast<int64_t>(xq.size()) < g.M * g.K) xq.resize(g.M * g.K);
  if (static_cast<int64_t>(xd.size()) < g.M * nb) xd.resize(g.M * nb);
  if (static_cast<int64_t>(xsum.size()) < g.M * nb) xsum.resize(g.M * nb);
  // Plain pointers for the lambdas: on torch's worker threads the thread_local names are theirs.
  uint8_t* q = xq.data();
  float* d = xd.data();
  int32_t* xs = xsum.data();
  at::parallel_for(0, g.M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; m++) quantize_row_u8(g.x + m * g.ldx, g.K, q + m * g.K, d + m * nb, xs + m * nb);
  });
  const auto& tile_fns = tiles_of(g.format);
  const int64_t record = q8_0::record_of(g.format).bytes;
  const int64_t panels = (g.M + q8_0::kPanelRows - 1) / q8_0::kPanelRows;
  at::parallel_for(0, panels * groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; unit++) {
      const int64_t grp = unit % groups, m0 = unit / groups * q8_0::kPanelRows;
      const int64_t m1 = std::min(g.M, m0 + q8_0::kPanelRows);
      const __mmask16 cols = tail_mask(g.N - grp * q8_0::kGroupCols);
      const uint8_t* wg = g.w + grp * nb * record;
      float* o = g.out + grp * q8_0::kGroupCols;
      for (int64_t m = m0; m < m1; m += kMaxTileRows) {
        const int64_t rows = std::min<int64_t>(kMaxTileRows, m1 - m);
        tile_fns[rows - 1](Rows{q + m * g.K, d + m * nb, xs + m * nb, g.K, nb}, wg, o + m * g.ldo, g.ldo, cols);
      }
    }
  });
}

}  // namespace
}  // namespace rtp_llm::ops::avx512
RTP_LLM_AVX512_END

namespace rtp_llm::ops::avx512 {

void q8_0_gemm(const q8_0::Gemm& g) {
  if (!q8_0_vnni_supported()) std::abort();  // callers check q8_0_vnni_supported()
  gemm_impl(g);
}

}  // namespace rtp_llm::ops::avx512

#else  // not x86_64: the portable kernel runs

namespace rtp_llm::ops::avx512 {

void q8_0_gemm(const q8_0::Gemm&) { std::abort(); }

}  // namespace rtp_llm::ops::avx512

#endif
