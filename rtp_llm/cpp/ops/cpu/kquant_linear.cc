// Q4_K / Q5_K / Q6_K projections (kquant.h): the operand checks and the run-time pick of the kernel
// (AVX-512 VNNI where the CPU has it, the Q8_0 kernels' gate; portable C++ elsewhere).
#include <ATen/ATen.h>

#include "rtp_llm/cpp/ops/compute_ops.h"
#include "rtp_llm/cpp/ops/cpu/kquant.h"
#include "rtp_llm/cpp/ops/cpu/q8_0.h"

namespace rtp_llm::ops {
namespace {

using kquant::Format;

at::Tensor kquant_linear(Format f, const char* fn, const char* pack_fn, int record_bytes, const at::Tensor& x,
                         const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& out, bool portable) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                  x.device().is_cpu(),
              fn, ": x must be an fp32 or bf16 [M, K] on the CPU");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kByte && packed.size(2) == record_bytes &&
                  packed.is_contiguous() && packed.device().is_cpu() && n > 0 &&
                  packed.size(0) == (n + kquant::kGroupCols - 1) / kquant::kGroupCols,
              fn, ": the weight must come from ", pack_fn, " of an [n = ", n, ", K] tensor");
  const int64_t m = x.size(0), k = packed.size(1) * kquant::kSuper;
  TORCH_CHECK(x.size(1) == k, fn, ": x has K = ", x.size(1), ", the weight ", k);
  if (out.has_value())
    TORCH_CHECK(out->dim() == 2 && out->size(0) == m && out->size(1) == n && out->scalar_type() == x.scalar_type(),
                fn, ": out must be [", m, ", ", n, "] of x's dtype");
  // The kernels read fp32 rows of unit stride and write fp32 (a copy each way for bf16: M x K
  // and M x N elements, small beside the M x N x K work).
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor of = at::empty({m, n}, xf.options());
  if (m > 0) {
    const kquant::Gemm g{xf.data_ptr<float>(), k, packed.data_ptr<uint8_t>(), of.data_ptr<float>(), n, m, n, k};
    if (!portable && avx512::q8_0_vnni_supported())
      avx512::kquant_gemm(f, g);
    else
      kquant::gemm_portable(f, g);
  }
  if (out.has_value()) return out->copy_(of);
  return of.scalar_type() == x.scalar_type() ? of : of.to(x.scalar_type());
}

}  // namespace

at::Tensor q4_k_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& out,
                       bool portable) {
  return kquant_linear(Format::kQ4K, "q4_k_linear", "pack_q4_k_linear", kquant::kQ4KRecordBytes, x, packed, n, out,
                       portable);
}

at::Tensor q5_k_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& out,
                       bool portable) {
  return kquant_linear(Format::kQ5K, "q5_k_linear", "pack_q5_k_linear", kquant::kQ5KRecordBytes, x, packed, n, out,
                       portable);
}

at::Tensor q6_k_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& out,
                       bool portable) {
  return kquant_linear(Format::kQ6K, "q6_k_linear", "pack_q6_k_linear", kquant::kQ6KRecordBytes, x, packed, n, out,
                       portable);
}

}  // namespace rtp_llm::ops
