// RMSNorm, alone and after the residual add (fused_add_rms_norm). Accumulates in fp32
// whatever the storage dtype (as HF's Qwen/Llama RMSNorm does); AVX-512 kernels where the CPU
// has them (avx512_row_ops.cc), portable loops elsewhere.
#include "rtp_llm/cpp/ops/compute_ops.h"

#include <cmath>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "rtp_llm/cpp/ops/cpu/avx512.h"

namespace rtp_llm::ops {

namespace {

// Row r of a contiguous [rows, dim] tensor as bytes (the AVX-512 kernels take untyped rows).
char* row_ptr(const at::Tensor& t, int64_t r) {
  return static_cast<char*>(t.data_ptr()) + r * t.size(1) * t.element_size();
}

// out = round(w * round(row * inv)), inv = 1 / rms of the row whose squares summed to sum_sq:
// HF's order (normalize, round to the storage dtype, then scale by the weight).
template <class scalar_t>
void scale_row(const scalar_t* row, const scalar_t* w, scalar_t* out, int64_t dim, float sum_sq, double eps) {
  const float inv = 1.f / std::sqrt(sum_sq / static_cast<float>(dim) + static_cast<float>(eps));
  for (int64_t i = 0; i < dim; ++i) {
    const scalar_t normed = static_cast<scalar_t>(static_cast<float>(row[i]) * inv);
    out[i] = static_cast<scalar_t>(static_cast<float>(w[i]) * static_cast<float>(normed));
  }
}

}  // namespace

// x: [num_tokens, hidden], weight: [hidden] -> [num_tokens, hidden], same dtype as x.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2, "rms_norm: x must be [num_tokens, hidden], got ", x.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1), "rms_norm: weight must be [",
              x.size(1), "], got ", weight.sizes());
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rms_norm: x is ", x.scalar_type(),
              " but weight is ", weight.scalar_type());
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "rms_norm: CPU tensors only");
  const at::Tensor in = x.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor out = at::empty_like(in);
  const int64_t rows = in.size(0);
  const int64_t hidden = in.size(1);
  if (const auto dtype = avx512::usable_for(in.scalar_type())) {
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      avx512::rms_norm(*dtype, row_ptr(in, begin), w.data_ptr(), row_ptr(out, begin), end - begin, hidden,
                       static_cast<float>(eps));
    });
    return out;
  }

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.scalar_type(), "rms_norm", [&] {
    const scalar_t* src = in.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* row = src + r * hidden;
        float sum_sq = 0.f;
        for (int64_t i = 0; i < hidden; ++i) {
          const float v = static_cast<float>(row[i]);
          sum_sq += v * v;
        }
        scale_row(row, wp, dst + r * hidden, hidden, sum_sq, eps);
      }
    });
  });
  return out;
}

at::Tensor fused_add_rms_norm(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.sizes() == residual.sizes() && x.dim() == 2, "fused_add_rms_norm: x and residual must be [N, D]");
  TORCH_CHECK(residual.is_contiguous(), "fused_add_rms_norm: residual must be contiguous");
  TORCH_CHECK(x.scalar_type() == residual.scalar_type() && x.scalar_type() == weight.scalar_type(),
              "fused_add_rms_norm: dtypes differ");
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(residual);
  const int64_t rows = x.size(0), dim = x.size(1);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == dim, "fused_add_rms_norm: weight must be a contiguous [", dim,
              "]");
  if (const auto dtype = avx512::usable_for(x.scalar_type())) {
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      avx512::add_rms_norm(*dtype, row_ptr(xc, begin), row_ptr(residual, begin), weight.data_ptr(),
                           row_ptr(out, begin), end - begin, dim, static_cast<float>(eps));
    });
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_add_rms_norm", [&] {
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    scalar_t* rp = residual.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* res = rp + r * dim;
        const scalar_t* in = xp + r * dim;
        float sum_sq = 0.f;
        for (int64_t i = 0; i < dim; ++i) {
          res[i] = static_cast<scalar_t>(static_cast<float>(res[i]) + static_cast<float>(in[i]));  // h + o, in dtype
          const float v = static_cast<float>(res[i]);
          sum_sq += v * v;
        }
        scale_row(res, wp, op + r * dim, dim, sum_sq, eps);
      }
    });
  });
  return out;
}

}  // namespace rtp_llm::ops
