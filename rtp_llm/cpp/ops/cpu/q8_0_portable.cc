// The portable kernel of the 32-block formats (q8_0.h): plain C++ for CPUs without AVX-512 VNNI
// (AVX2, aarch64) and for RTP_LLM_CPU_AVX512=0. The same arithmetic as avx512_q8_0.cc (narrow
// records unpacked to the wide one's int8 q first):
// activations quantized per row and 32-block to int8, exact int32 sums per (row, column, block),
// then acc = fma(sum, d_w * d_x, acc) (and, with a min, acc = fma(sum of x's q, m * d_x, acc))
// block by block, so the two kernels agree to the last bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include "rtp_llm/cpp/ops/cpu/q8_0.h"

namespace rtp_llm::ops::q8_0 {
namespace {

float fp16_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return c10::detail::fp16_ieee_to_fp32_value(bits);
}

// One row of x (K floats) -> q [K] in [-127, 127], the scales d [K / 32] and the blocks' sums
// of q, xs [K / 32].
void quantize_row(const float* x, int64_t K, int8_t* q, float* d, int32_t* xs) {
  for (int64_t b = 0; b < K / kBlock; b++) {
    const float* xb = x + b * kBlock;
    float amax = 0.f;
    for (int j = 0; j < kBlock; j++) amax = std::max(amax, std::fabs(xb[j]));
    const float db = amax / kQMax;
    const float id = db != 0.f ? 1.f / db : 0.f;
    int32_t sum = 0;
    for (int j = 0; j < kBlock; j++) {
      q[b * kBlock + j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));
      sum += q[b * kBlock + j];
    }
    d[b] = db;
    xs[b] = sum;
  }
}

// A record's q as the wide record's int8 operands ([8][64], q8_0.h): as stored (8 bits), or
// from the nibbles (and the 5th bits) less the zero point.
const int8_t* operands(const uint8_t* rec, const Record& r, int8_t* q) {
  if (r.bits == 8) return reinterpret_cast<const int8_t*>(rec);
  for (int t = 0; t < kQuadsPerBlock; t++) {
    uint64_t plane = 0;
    if (r.bits == 5) std::memcpy(&plane, rec + kNibbleBytes + 8 * t, sizeof(plane));
    for (int i = 0; i < kOperandBytes; i++) {
      const int nib = (rec[kOperandBytes * (t / 2) + i] >> (4 * (t % 2))) & 0xF;
      q[kOperandBytes * t + i] = static_cast<int8_t>(nib + 16 * static_cast<int>((plane >> i) & 1) - r.zero);
    }
  }
  return q;
}

// Block b of a group (its record `rec`, operands `qs`) against rows [m0, m1): acc[(m - m0) * 16
// + c] += column c's share, for every row; each row's blocks arrive in order, as one row's
// loop would take them.
void block_rows(const Record& r, const uint8_t* rec, const int8_t* qs, int64_t b, int64_t nb, int64_t K,
                const int8_t* xq, const float* xd, const int32_t* xs, int64_t m0, int64_t m1, float* acc) {
  for (int64_t m = m0; m < m1; m++) {
    const int8_t* xb = xq + m * K + b * kBlock;
    const float dx = xd[m * nb + b];
    float* a = acc + (m - m0) * kGroupCols;
    int32_t sum[kGroupCols] = {};
    for (int t = 0; t < kQuadsPerBlock; t++)
      for (int c = 0; c < kGroupCols; c++)
        for (int j = 0; j < 4; j++) sum[c] += xb[4 * t + j] * qs[kOperandBytes * t + 4 * c + j];
    for (int c = 0; c < kGroupCols; c++) {
      a[c] = std::fma(static_cast<float>(sum[c]), fp16_at(rec + r.scales + 2 * c) * dx, a[c]);
      if (r.mins >= 0) a[c] = std::fma(static_cast<float>(xs[m * nb + b]), fp16_at(rec + r.mins + 2 * c) * dx, a[c]);
    }
  }
}

}  // namespace

void gemm_portable(const Gemm& g) {
  const int64_t nb = g.K / kBlock, groups = (g.N + kGroupCols - 1) / kGroupCols;
  std::vector<int8_t> xq(g.M * g.K);
  std::vector<float> xd(g.M * nb);
  std::vector<int32_t> xs(g.M * nb);
  at::parallel_for(0, g.M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; m++)
      quantize_row(g.x + m * g.ldx, g.K, xq.data() + m * g.K, xd.data() + m * nb, xs.data() + m * nb);
  });
  const Record r = record_of(g.format);
  const int64_t panels = (g.M + kPanelRows - 1) / kPanelRows;
  at::parallel_for(0, panels * groups, 1, [&](int64_t begin, int64_t end) {
    int8_t unpacked[kQsBytes];
    std::vector<float> acc;
    for (int64_t unit = begin; unit < end; unit++) {
      const int64_t grp = unit % groups, m0 = unit / groups * kPanelRows, m1 = std::min(g.M, m0 + kPanelRows);
      const int64_t cols = std::min<int64_t>(kGroupCols, g.N - grp * kGroupCols);
      acc.assign((m1 - m0) * kGroupCols, 0.f);
      for (int64_t b = 0; b < nb; b++) {  // each record unpacked once for the whole panel
        const uint8_t* rec = g.w + (grp * nb + b) * r.bytes;
        block_rows(r, rec, operands(rec, r, unpacked), b, nb, g.K, xq.data(), xd.data(), xs.data(), m0, m1,
                   acc.data());
      }
      for (int64_t m = m0; m < m1; m++)
        std::memcpy(g.out + m * g.ldo + grp * kGroupCols, acc.data() + (m - m0) * kGroupCols, cols * sizeof(float));
    }
  });
}

}  // namespace rtp_llm::ops::q8_0
