// bf16 projections through the AVX512-BF16 GEMM (avx512::bf16_gemm): packing and checks.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include "rtp_llm/cpp/ops/compute_ops.h"
#include "rtp_llm/cpp/ops/cpu/avx512.h"

namespace rtp_llm::ops {

bool bf16_linear_supported() { return avx512::bf16_gemm_supported(); }

at::Tensor pack_bf16_linear(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16,
              "pack_bf16_linear: weight must be a bf16 [N, K]");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % 16 == 0 && k % 2 == 0, "pack_bf16_linear: weight [", n, ", ", k,
              "] needs N % 16 == 0 and an even K");
  return weight.contiguous().view({n / 16, 16, k / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& out) {
  TORCH_CHECK(bf16_linear_supported(), "bf16_linear: this CPU has no AVX512-BF16 (check bf16_linear_supported())");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.device().is_cpu(),
              "bf16_linear: x must be a bf16 [M, K] on the CPU");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == 16 && packed.size(3) == 2 &&
                  packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() && packed.device().is_cpu(),
              "bf16_linear: packed must come from pack_bf16_linear");
  const int64_t m = x.size(0), k = x.size(1), n = packed.size(0) * 16;
  TORCH_CHECK(k == 2 * packed.size(1), "bf16_linear: x has K = ", k, ", the weight ", 2 * packed.size(1));
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  at::Tensor o = out.has_value() ? *out : at::empty({m, n}, x.options());
  TORCH_CHECK(o.dim() == 2 && o.size(0) == m && o.size(1) == n && o.scalar_type() == at::kBFloat16 &&
                  o.stride(1) == 1 && o.device().is_cpu(),
              "bf16_linear: out must be a bf16 [", m, ", ", n, "] on the CPU with rows of unit stride");
  // The threads write disjoint column blocks of distinct rows, while every one reads all of x.
  at::assert_no_internal_overlap(o);
  at::assert_no_overlap(o, xc);
  if (m == 0) return o;
  avx512::bf16_gemm(static_cast<const uint16_t*>(xc.data_ptr()), xc.stride(0),
                    static_cast<const uint16_t*>(packed.data_ptr()), static_cast<uint16_t*>(o.data_ptr()),
                    o.stride(0), m, n, k);
  return o;
}

}  // namespace rtp_llm::ops
