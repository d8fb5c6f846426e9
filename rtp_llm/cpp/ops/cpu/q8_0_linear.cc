// Projections of the 32-block formats (q8_0.h): the operand checks and the run-time pick of the
// kernel (AVX-512 VNNI where the CPU has it, portable elsewhere). Packing: block32_pack.cc.
#include <ATen/ATen.h>

#include <cctype>
#include <string>
#include <utility>

#include "rtp_llm/cpp/ops/compute_ops.h"
#include "rtp_llm/cpp/ops/cpu/q8_0.h"

namespace rtp_llm::ops {

using q8_0::Format;
using q8_0::kBlock;
using q8_0::kGroupCols;

namespace {

// The format of a GGUF type name (the packer's: pack_<name>_linear), or fails naming it.
Format format_named(const std::string& qtype) {
  static const std::pair<const char*, Format> kNames[] = {{"Q8_0", Format::kQ8_0}, {"Q4_0", Format::kQ4_0},
                                                          {"Q4_1", Format::kQ4_1}, {"Q5_0", Format::kQ5_0},
                                                          {"Q5_1", Format::kQ5_1}};
  for (const auto& [name, f] : kNames)
    if (qtype == name) return f;
  TORCH_CHECK(false, "q8_0_linear: qtype must be Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1, got '", qtype, "'");
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

bool q8_0_linear_vectorized() { return avx512::q8_0_vnni_supported(); }

at::Tensor q8_0_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::string& qtype,
                       const std::optional<at::Tensor>& out, bool portable) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                  x.device().is_cpu(),
              "q8_0_linear: x must be an fp32 or bf16 [M, K] on the CPU");
  const Format format = format_named(qtype);
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kByte && packed.size(2) == q8_0::record_of(format).bytes &&
                  packed.is_contiguous() && packed.device().is_cpu() && n > 0 &&
                  packed.size(0) == (n + kGroupCols - 1) / kGroupCols,
              "q8_0_linear: the weight must come from pack_", lower(qtype), "_linear of an [n = ", n, ", K] tensor");
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
    const q8_0::Gemm g{xf.data_ptr<float>(), k, packed.data_ptr<uint8_t>(), of.data_ptr<float>(), n, m, n, k, format};
    if (!portable && avx512::q8_0_vnni_supported())
      avx512::q8_0_gemm(g);
    else
      q8_0::gemm_portable(g);
  }
  if (out.has_value()) return out->copy_(of);
  return of.scalar_type() == x.scalar_type() ? of : of.to(x.scalar_type());
}

}  // namespace rtp_llm::ops
