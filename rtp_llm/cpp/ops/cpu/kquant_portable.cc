// The portable Q4_K / Q5_K / Q6_K kernels (kquant.h): plain C++ for CPUs without AVX-512 VNNI (AVX2,
// aarch64) and for RTP_LLM_CPU_AVX512=0, and the activation quantizer both kernels share. The
// integer sums and fp32 steps are kquant.h's, in its order, so the AVX-512 kernel agrees to the
// last bit. Each record is decoded once per (panel, group) into plain quants, then every row of
// the panel reads it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include "rtp_llm/cpp/ops/cpu/kquant.h"

namespace rtp_llm::ops::kquant {
namespace {

float fp16_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return c10::detail::fp16_ieee_to_fp32_value(bits);
}

// A record's 16 columns x 256 weights as plain unsigned quants, q[c][k]: the nibble vectors
// (and Q5_K's bit plane, Q6_K's high-bit vectors) read in storage order, kquant.h's layout
// inverted.
void decode_quants(Format f, const uint8_t* rec, uint8_t (*q)[kSuper]) {
  for (int v = 0; v < kSuper / 8; v++)
    for (int c = 0; c < kGroupCols; c++)
      for (int t = 0; t < 4; t++) {
        const uint8_t byte = rec[64 * v + 4 * c + t];
        q[c][8 * v + t] = byte & 0xF;
        q[c][8 * v + 4 + t] = byte >> 4;
      }
  if (f == Format::kQ5K) {
    for (int operand = 0; operand < kSuper / 4; operand++) {
      uint64_t plane;
      std::memcpy(&plane, rec + kQ5KRecord.high + 8 * operand, sizeof(plane));
      for (int c = 0; c < kGroupCols; c++)
        for (int t = 0; t < 4; t++)
          q[c][8 * (operand / 2) + 4 * (operand % 2) + t] |= static_cast<uint8_t>(((plane >> (4 * c + t)) & 1) << 4);
    }
  }
  if (f != Format::kQ6K) return;
  for (int u = 0; u < kQ6KSubs; u++)
    for (int c = 0; c < kGroupCols; c++)
      for (int t = 0; t < 4; t++) {
        const uint8_t high = rec[kQ6KHighOffset + 64 * u + 4 * c + t];
        for (int i = 0; i < 4; i++) q[c][16 * u + 4 * i + t] |= static_cast<uint8_t>(((high >> (2 * i)) & 3) << 4);
      }
}

int32_t dot(const uint8_t* w, const int8_t* x, int n) {
  int32_t s = 0;
  for (int i = 0; i < n; i++) s += w[i] * x[i];
  return s;
}

// One row's super-block b against a decoded Q4_K or Q5_K record of layout r: acc[16] += the
// columns' dot products.
void sub_scaled_row(const SubScaledRecord& r, const uint8_t* rec, const uint8_t (*q)[kSuper], const int8_t* xq,
                    float dx, const int32_t* sums, float* acc) {
  for (int c = 0; c < kGroupCols; c++) {
    int32_t s1 = 0, s2 = 0;
    for (int j = 0; j < kQ4KSubs; j++) {
      s1 += rec[r.scales + kGroupCols * j + c] * dot(q[c] + kQ4KSub * j, xq + kQ4KSub * j, kQ4KSub);
      s2 += rec[r.mins + kGroupCols * j + c] * (sums[2 * j] + sums[2 * j + 1]);
    }
    acc[c] = std::fma(static_cast<float>(s1), fp16_at(rec + r.d + 2 * c) * dx, acc[c]);
    acc[c] = std::fma(-static_cast<float>(s2), fp16_at(rec + r.dmin + 2 * c) * dx, acc[c]);
  }
}

void q6_k_row(const uint8_t* rec, const uint8_t (*q)[kSuper], const int8_t* xq, float dx, const int32_t* sums,
              float* acc) {
  for (int c = 0; c < kGroupCols; c++) {
    int32_t s = 0;
    for (int j = 0; j < kQ6KSubs; j++) {
      const int32_t sc = static_cast<int8_t>(rec[kQ6KScalesOffset + kGroupCols * j + c]);
      s += sc * (dot(q[c] + kQ6KSub * j, xq + kQ6KSub * j, kQ6KSub) - kQ6KBias * sums[j]);
    }
    acc[c] = std::fma(static_cast<float>(s), fp16_at(rec + kQ6KDOffset + 2 * c) * dx, acc[c]);
  }
}

}  // namespace

void quantize_activations(const float* x, int64_t ldx, int64_t M, int64_t K, const Activations& a) {
  const int64_t nb = K / kSuper;
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; m++)
      for (int64_t b = 0; b < nb; b++) {
        const float* xb = x + m * ldx + b * kSuper;
        int8_t* q = a.q + m * K + b * kSuper;
        float amax = 0.f;
        for (int i = 0; i < kSuper; i++) amax = std::max(amax, std::fabs(xb[i]));
        const float d = amax / kQMax;
        const float id = d != 0.f ? 1.f / d : 0.f;
        for (int i = 0; i < kSuper; i++) q[i] = static_cast<int8_t>(std::nearbyint(xb[i] * id));
        for (int s = 0; s < kSumsPerSuper; s++) {
          int32_t sum = 0;
          for (int i = 0; i < 16; i++) sum += q[16 * s + i];
          a.sums[(m * nb + b) * kSumsPerSuper + s] = sum;
        }
        a.d[m * nb + b] = d;
      }
  });
}

void gemm_portable(Format f, const Gemm& g) {
  const int64_t nb = g.K / kSuper, groups = (g.N + kGroupCols - 1) / kGroupCols;
  const int record = record_bytes(f);
  std::vector<int8_t> xq(g.M * g.K);
  std::vector<float> xd(g.M * nb);
  std::vector<int32_t> sums(g.M * nb * kSumsPerSuper);
  quantize_activations(g.x, g.ldx, g.M, g.K, {xq.data(), xd.data(), sums.data()});
  const int64_t panels = (g.M + kPanelRows - 1) / kPanelRows;
  at::parallel_for(0, panels * groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> decoded(kGroupCols * kSuper);
    auto* q = reinterpret_cast<uint8_t (*)[kSuper]>(decoded.data());
    for (int64_t unit = begin; unit < end; unit++) {
      const int64_t grp = unit % groups, m0 = unit / groups * kPanelRows, m1 = std::min(g.M, m0 + kPanelRows);
      const int64_t cols = std::min<int64_t>(kGroupCols, g.N - grp * kGroupCols);
      std::vector<float> acc((m1 - m0) * kGroupCols, 0.f);
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t* rec = g.w + (grp * nb + b) * record;
        decode_quants(f, rec, q);
        for (int64_t m = m0; m < m1; m++) {
          const int8_t* xb = xq.data() + m * g.K + b * kSuper;
          const int32_t* s = sums.data() + (m * nb + b) * kSumsPerSuper;
          float* a = acc.data() + (m - m0) * kGroupCols;
          if (f != Format::kQ6K)
            sub_scaled_row(f == Format::kQ4K ? kQ4KRecord : kQ5KRecord, rec, q, xb, xd[m * nb + b], s, a);
          else
            q6_k_row(rec, q, xb, xd[m * nb + b], s, a);
        }
      }
      for (int64_t m = m0; m < m1; m++)
        std::memcpy(g.out + m * g.ldo + grp * kGroupCols, acc.data() + (m - m0) * kGroupCols, cols * sizeof(float));
    }
  });
}

}  // namespace rtp_llm::ops::kquant
