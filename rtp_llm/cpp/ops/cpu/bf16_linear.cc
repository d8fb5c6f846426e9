// bf16 projections through the AVX512-BF16 GEMM (avx512::bf16_gemm): packing and checks.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <utility>

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

at::Tensor pack_bf16_gate_up(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % 32 == 0,
              "pack_bf16_gate_up: weight must be [2 I, K] (gate rows, then up rows) with I % 16 == 0");
  const int64_t i = weight.size(0) / 2, k = weight.size(1);
  // Row blocks of 16 alternate: gate 16j.., up 16j.. (bf16_linear_silu pairs them). Returned
  // as [I / 16, 2, K / 2, 16, 2], a rank of its own, so that it is never taken for a plain
  // projection's packing (or one of those for it).
  return pack_bf16_linear(weight.contiguous().view({2, i / 16, 16, k}).transpose(0, 1).reshape({2 * i, k}))
      .view({i / 16, 2, k / 2, 16, 2});
}

namespace {

// x [M, K] and a packed weight of N columns checked for the bf16 GEMM; returns x with unit
// stride along K and the output [M, cols] (`out`, checked, when given).
std::pair<at::Tensor, at::Tensor> gemm_operands(const char* op, const at::Tensor& x, const at::Tensor& packed,
                                                const std::optional<at::Tensor>& out, int64_t cols) {
  TORCH_CHECK(bf16_linear_supported(), op, ": this CPU has no AVX512-BF16 (check bf16_linear_supported())");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.device().is_cpu(), op,
              ": x must be a bf16 [M, K] on the CPU");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == 16 && packed.size(3) == 2 &&
                  packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() && packed.device().is_cpu(),
              op, ": the weight must come from pack_bf16_linear");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k == 2 * packed.size(1), op, ": x has K = ", k, ", the weight ", 2 * packed.size(1));
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  at::Tensor o = out.has_value() ? *out : at::empty({m, cols}, x.options());
  TORCH_CHECK(o.dim() == 2 && o.size(0) == m && o.size(1) == cols && o.scalar_type() == at::kBFloat16 &&
                  o.stride(1) == 1 && o.device().is_cpu(),
              op, ": out must be a bf16 [", m, ", ", cols, "] on the CPU with rows of unit stride");
  // The threads write disjoint column blocks of distinct rows, while every one reads all of x.
  at::assert_no_internal_overlap(o);
  at::assert_no_overlap(o, xc);
  return {xc, o};
}

}  // namespace

at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& out) {
  const int64_t n = packed.dim() == 4 ? packed.size(0) * 16 : 0;
  auto [xc, o] = gemm_operands("bf16_linear", x, packed, out, n);
  if (xc.size(0) == 0) return o;
  avx512::bf16_gemm(static_cast<const uint16_t*>(xc.data_ptr()), xc.stride(0),
                    static_cast<const uint16_t*>(packed.data_ptr()), static_cast<uint16_t*>(o.data_ptr()),
                    o.stride(0), xc.size(0), n, xc.size(1));
  return o;
}

at::Tensor bf16_linear_silu(const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(packed.dim() == 5 && packed.size(1) == 2 && packed.size(3) == 16 && packed.size(4) == 2 &&
                  packed.is_contiguous(),
              "bf16_linear_silu: the weight must come from pack_bf16_gate_up");
  const int64_t n = packed.size(0) * 32;
  auto [xc, o] = gemm_operands("bf16_linear_silu", x, packed.view({n / 16, packed.size(2), 16, 2}), std::nullopt,
                               n / 2);
  if (xc.size(0) == 0) return o;
  avx512::bf16_gemm_silu(static_cast<const uint16_t*>(xc.data_ptr()), xc.stride(0),
                         static_cast<const uint16_t*>(packed.data_ptr()), static_cast<uint16_t*>(o.data_ptr()),
                         o.stride(0), xc.size(0), n, xc.size(1));
  return o;
}

}  // namespace rtp_llm::ops
