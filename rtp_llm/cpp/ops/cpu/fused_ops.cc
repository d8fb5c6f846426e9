// Element-wise pieces of a decoder layer fused into single passes: each replaces several
// torch ops (and their per-op dispatch cost, which dominates small decode batches).
#include <cmath>
#include <cstring>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "rtp_llm/cpp/ops/compute_ops.h"
#include "rtp_llm/cpp/ops/cpu/avx512.h"

namespace rtp_llm::ops {

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
    const size_t row_bytes = dim * x.element_size();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      avx512::add_rms_norm(*dtype, static_cast<const char*>(xc.data_ptr()) + begin * row_bytes,
                           static_cast<char*>(residual.data_ptr()) + begin * row_bytes, weight.data_ptr(),
                           static_cast<char*>(out.data_ptr()) + begin * row_bytes, end - begin, dim,
                           static_cast<float>(eps));
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
        const float inv = 1.f / std::sqrt(sum_sq / static_cast<float>(dim) + static_cast<float>(eps));
        scalar_t* o = op + r * dim;
        for (int64_t i = 0; i < dim; ++i) {
          const scalar_t normed = static_cast<scalar_t>(static_cast<float>(res[i]) * inv);
          o[i] = static_cast<scalar_t>(static_cast<float>(wp[i]) * static_cast<float>(normed));
        }
      }
    });
  });
  return out;
}

void rotary_embedding(at::Tensor& q, at::Tensor& k, const at::Tensor& positions, const at::Tensor& cos,
                      const at::Tensor& sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2),
              "rotary_embedding: q [T, H, D] and k [T, Hkv, D] expected");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1, "rotary_embedding: the head dim must be contiguous");
  TORCH_CHECK(positions.scalar_type() == at::kLong && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "rotary_embedding: positions int64, cos/sin float32 expected");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "rotary_embedding: cos/sin must be contiguous");
  const int64_t T = q.size(0), half = q.size(2) / 2;
  TORCH_CHECK(cos.size(1) == half, "rotary_embedding: cos/sin must be [positions, D/2]");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "rotary_embedding", [&] {
    auto rotate = [&](at::Tensor& x, int64_t t) {
      const float* c = cp + pos[t] * half;
      const float* s = sp + pos[t] * half;
      for (int64_t h = 0; h < x.size(1); ++h) {
        scalar_t* v = x.data_ptr<scalar_t>() + t * x.stride(0) + h * x.stride(1);
        for (int64_t i = 0; i < half; ++i) {
          // HF's rotate_half layout: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
          const float x1 = static_cast<float>(v[i]), x2 = static_cast<float>(v[i + half]);
          v[i] = static_cast<scalar_t>(x1 * c[i] - x2 * s[i]);
          v[i + half] = static_cast<scalar_t>(x2 * c[i] + x1 * s[i]);
        }
      }
    };
    at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        rotate(q, t);
        rotate(k, t);
      }
    });
  });
}

at::Tensor silu_and_mul(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "silu_and_mul: x must be [T, 2 I]");
  const at::Tensor xc = x.contiguous();
  const int64_t rows = x.size(0), inter = x.size(1) / 2;
  at::Tensor out = at::empty({rows, inter}, x.options());
  if (const auto dtype = avx512::usable_for(x.scalar_type())) {
    at::parallel_for(0, rows * inter, 4096, [&](int64_t begin, int64_t end) {
      avx512::silu_and_mul(*dtype, xc.data_ptr(), out.data_ptr(), inter, begin, end);
    });
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows * inter, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t r = i / inter, j = i % inter;
        const float g = static_cast<float>(xp[r * 2 * inter + j]);
        const float u = static_cast<float>(xp[r * 2 * inter + inter + j]);
        // HF: act(gate) rounded to the dtype, then times up.
        const scalar_t act = static_cast<scalar_t>(g / (1.f + std::exp(-g)));
        op[i] = static_cast<scalar_t>(static_cast<float>(act) * u);
      }
    });
  });
  return out;
}

void store_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& kv_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "store_kv: kv_cache must be a contiguous [2, blocks, block_size, Hkv, D]");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "store_kv: slot_mapping must be int64");
  const int64_t T = k.size(0), width = kv_cache.size(3) * kv_cache.size(4);
  TORCH_CHECK(k.numel() == T * width && v.numel() == T * width, "store_kv: k/v must be [T, Hkv, D]");
  const int64_t slots = kv_cache.size(1) * kv_cache.size(2);
  const at::Tensor kc = k.contiguous(), vc = v.contiguous();
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  const size_t bytes = width * kv_cache.element_size();
  char* kbase = static_cast<char*>(kv_cache.data_ptr());
  char* vbase = kbase + slots * bytes;
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(slot[t] >= 0 && slot[t] < slots, "store_kv: slot ", slot[t], " out of range");
    std::memcpy(kbase + slot[t] * bytes, static_cast<const char*>(kc.data_ptr()) + t * bytes, bytes);
    std::memcpy(vbase + slot[t] * bytes, static_cast<const char*>(vc.data_ptr()) + t * bytes, bytes);
  }
}

double cpu_bf16_peak_gflops() { return avx512::bf16_dot_peak_gflops(); }

}  // namespace rtp_llm::ops
