// Q8_0 projections (q8_0.h): packing the file's blocks for the kernels, the operand checks,
// and the run-time pick of the kernel (AVX-512 VNNI where the CPU has it, portable elsewhere).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>

#include "rtp_llm/cpp/ops/compute_ops.h"
#include "rtp_llm/cpp/ops/cpu/q8_0.h"

namespace rtp_llm::ops {

using q8_0::kBlock;
using q8_0::kFileBlockBytes;
using q8_0::kGroupCols;
using q8_0::kPackedBlockBytes;

bool q8_0_linear_vectorized() { return avx512::q8_0_vnni_supported(); }

at::Tensor pack_q8_0_linear(const at::Tensor& blocks) {
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte && blocks.device().is_cpu() &&
                  blocks.size(1) % kFileBlockBytes == 0,
              "pack_q8_0_linear: blocks must be a uint8 [N, K / 32 * 34] on the CPU (a GGUF Q8_0 tensor's rows), got ",
              blocks.sizes());
  const at::Tensor raw = blocks.contiguous();
  const int64_t n = raw.size(0), nb = raw.size(1) / kFileBlockBytes, groups = (n + kGroupCols - 1) / kGroupCols;
  at::Tensor packed = at::zeros({groups, nb, kPackedBlockBytes}, raw.options());  // padded columns stay 0
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = packed.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; g++)
      for (int64_t c = 0; c < kGroupCols && g * kGroupCols + c < n; c++)
        for (int64_t b = 0; b < nb; b++) {
          const uint8_t* blk = src + (g * kGroupCols + c) * raw.size(1) + b * kFileBlockBytes;
          uint8_t* rec = dst + (g * nb + b) * kPackedBlockBytes;
          std::memcpy(rec + q8_0::kScalesOffset + 2 * c, blk, 2);
          int32_t sum = 0;
          for (int k = 0; k < kBlock; k++) {
            const int8_t q = static_cast<int8_t>(blk[2 + k]);
            rec[64 * (k / 4) + 4 * c + k % 4] = static_cast<uint8_t>(q);
            sum += q;
          }
          const int16_t s = static_cast<int16_t>(sum);  // |sum| <= 32 x 128
          std::memcpy(rec + q8_0::kSumsOffset + 2 * c, &s, 2);
        }
  });
  return packed;
}

at::Tensor q8_0_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& out,
                       bool portable) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                  x.device().is_cpu(),
              "q8_0_linear: x must be an fp32 or bf16 [M, K] on the CPU");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kByte && packed.size(2) == kPackedBlockBytes &&
                  packed.is_contiguous() && packed.device().is_cpu() && n > 0 &&
                  packed.size(0) == (n + kGroupCols - 1) / kGroupCols,
              "q8_0_linear: the weight must come from pack_q8_0_linear of an [n = ", n, ", K] tensor");
  const int64_t m = x.size(0), k = packed.size(1) * kBlock;
  TORCH_CHECK(x.size(1) == k, "q8_0_linear: x has K = ", x.size(1), ", the weight ", k);
  if (out.has_value())
    TORCH_CHECK(out->dim() == 2 && out->size(0) == m && out->size(1) == n && out->scalar_type() == x.scalar_type(),
                "q8_0_linear: out must be [", m, ", ", n, "] of x's dtype");
  // The kernels read fp32 rows of unit stride and write fp32 (a copy each way for bf16: M x K
  // and M x N elements, small beside the M x N x K work).
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor of = at::empty({m, n}, xf.options());
  if (m > 0) {
    const q8_0::Gemm g{xf.data_ptr<float>(), k, packed.data_ptr<uint8_t>(), of.data_ptr<float>(), n, m, n, k};
    if (!portable && avx512::q8_0_vnni_supported())
      avx512::q8_0_gemm(g);
    else
      q8_0::gemm_portable(g);
  }
  if (out.has_value()) return out->copy_(of);
  return of.scalar_type() == x.scalar_type() ? of : of.to(x.scalar_type());
}

}  // namespace rtp_llm::ops
