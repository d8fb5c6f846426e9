#include "rtp_llm/cpp/ops/compute_ops.h"

#include <cmath>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "rtp_llm/cpp/ops/cpu/avx512.h"

namespace rtp_llm::ops {

// x: [num_tokens, hidden], weight: [hidden] -> [num_tokens, hidden], same dtype as x.
// Accumulates in fp32 whatever the storage dtype (as HF's Qwen/Llama RMSNorm does).
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
    const size_t row_bytes = hidden * in.element_size();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      avx512::rms_norm(*dtype, static_cast<const char*>(in.data_ptr()) + begin * row_bytes, w.data_ptr(),
                       static_cast<char*>(out.data_ptr()) + begin * row_bytes, end - begin, hidden,
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
        const float inv = 1.f / std::sqrt(sum_sq / static_cast<float>(hidden) + static_cast<float>(eps));
        scalar_t* orow = dst + r * hidden;
        for (int64_t i = 0; i < hidden; ++i) {
          // HF order: normalize, round to the storage dtype, then scale by the weight.
          const scalar_t normed = static_cast<scalar_t>(static_cast<float>(row[i]) * inv);
          orow[i] = static_cast<scalar_t>(static_cast<float>(wp[i]) * static_cast<float>(normed));
        }
      }
    });
  });
  return out;
}

}  // namespace rtp_llm::ops
