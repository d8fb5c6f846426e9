// Element-wise pieces of a decoder layer fused into single passes: each replaces several
// torch ops (and their per-op dispatch cost, which dominates small decode batches).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "rtp_llm/cpp/ops/compute_ops.h"
#include "rtp_llm/cpp/ops/cpu/avx512.h"

namespace rtp_llm::ops {

namespace {

void check_rotary(const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim,
                  const char* op) {
  TORCH_CHECK(positions.scalar_type() == at::kLong && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              op, ": positions int64, cos/sin float32 expected");
  TORCH_CHECK(positions.is_contiguous() && positions.device().is_cpu() && cos.device().is_cpu() && sin.device().is_cpu(),
              op, ": positions, cos and sin must be contiguous CPU tensors");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.dim() == 2 && cos.sizes() == sin.sizes() &&
                  cos.size(1) == head_dim / 2,
              op, ": cos/sin must be contiguous [positions, head_dim / 2]");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < positions.numel(); ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), op, ": position ", pos[t], " is outside the rotary table of ",
                cos.size(0));
  }
}

// Rotary of token t's head rows of x ([T, heads, D], head dim contiguous), in place.
void rotate_token(at::Tensor& x, int64_t t, const float* cos, const float* sin) {
  const int64_t heads = x.size(1), half = x.size(2) / 2;
  if (const auto dtype = avx512::usable_for(x.scalar_type())) {
    avx512::rotate_heads(*dtype, static_cast<char*>(x.data_ptr()) + t * x.stride(0) * x.element_size(), heads,
                         x.stride(1), half, cos, sin);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary", [&] {
    for (int64_t h = 0; h < heads; ++h) {
      scalar_t* v = x.data_ptr<scalar_t>() + t * x.stride(0) + h * x.stride(1);
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = static_cast<float>(v[i]), x2 = static_cast<float>(v[i + half]);
        v[i] = static_cast<scalar_t>(x1 * cos[i] - x2 * sin[i]);
        v[i + half] = static_cast<scalar_t>(x2 * cos[i] + x1 * sin[i]);
      }
    }
  });
}

// Rotary of token t (at position `pos`) of q [T, H, D] and k [T, Hkv, D], in place.
void rotate_qk(at::Tensor& q, at::Tensor& k, int64_t t, int64_t pos, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = q.size(2) / 2;
  const float* c = cos.data_ptr<float>() + pos * half;
  const float* s = sin.data_ptr<float>() + pos * half;
  rotate_token(q, t, c, s);
  rotate_token(k, t, c, s);
}

// The paged cache's K and V planes and the bytes of one slot (Hkv x D), checked.
struct KvPlanes {
  char* k;
  char* v;
  int64_t slots;
  size_t slot_bytes;
};

KvPlanes kv_planes(at::Tensor& kv_cache, const at::Tensor& slot_mapping, int64_t tokens, const char* op) {
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(), op,
              ": kv_cache must be a contiguous [2, blocks, block_size, Hkv, D]");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() == tokens &&
                  slot_mapping.is_contiguous() && slot_mapping.device().is_cpu() && kv_cache.device().is_cpu(),
              op, ": slot_mapping must be a contiguous int64 CPU tensor with one slot per token, kv_cache on the CPU");
  const int64_t slots = kv_cache.size(1) * kv_cache.size(2);
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(slot[t] >= 0 && slot[t] < slots, op, ": slot ", slot[t], " out of range");
  const size_t bytes = kv_cache.size(3) * kv_cache.size(4) * kv_cache.element_size();
  char* k = static_cast<char*>(kv_cache.data_ptr());
  return {k, k + slots * bytes, slots, bytes};
}

// Token t's row of x ([T, Hkv, D], each row's heads contiguous) into slot `slot` of a plane.
inline void store_row(const at::Tensor& x, int64_t t, char* plane, int64_t slot, size_t bytes) {
  std::memcpy(plane + slot * bytes, static_cast<const char*>(x.data_ptr()) + t * x.stride(0) * x.element_size(), bytes);
}

}  // namespace

void rotary_embedding(at::Tensor& q, at::Tensor& k, const at::Tensor& positions, const at::Tensor& cos,
                      const at::Tensor& sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2),
              "rotary_embedding: q [T, H, D] and k [T, Hkv, D] expected");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1, "rotary_embedding: the head dim must be contiguous");
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), "rotary_embedding: q and k dtypes differ");
  TORCH_CHECK(positions.numel() == q.size(0), "rotary_embedding: one position per token expected");
  check_rotary(positions, cos, sin, q.size(2), "rotary_embedding");
  const int64_t* pos = positions.data_ptr<int64_t>();
  at::parallel_for(0, q.size(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) rotate_qk(q, k, t, pos[t], cos, sin);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_rope_store(const at::Tensor& qkv, int64_t num_heads,
                                                              int64_t num_kv_heads, const at::Tensor& positions,
                                                              const at::Tensor& cos, const at::Tensor& sin,
                                                              at::Tensor& kv_cache, const at::Tensor& slot_mapping,
                                                              const std::optional<at::Tensor>& q_norm,
                                                              const std::optional<at::Tensor>& k_norm, double eps) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1, "qkv_rope_store: qkv must be [T, (H + 2 Hkv) D], unit stride");
  TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && qkv.size(1) % (num_heads + 2 * num_kv_heads) == 0,
              "qkv_rope_store: qkv's width ", qkv.size(1), " is not (num_heads + 2 num_kv_heads) x head_dim");
  TORCH_CHECK(qkv.scalar_type() == kv_cache.scalar_type(), "qkv_rope_store: qkv and kv_cache dtypes differ");
  TORCH_CHECK(qkv.device().is_cpu(), "qkv_rope_store: qkv must be on the CPU");
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "qkv_rope_store: q_norm and k_norm come together");
  const int64_t T = qkv.size(0), D = qkv.size(1) / (num_heads + 2 * num_kv_heads);
  for (const auto* w : {&q_norm, &k_norm}) {
    TORCH_CHECK(!w->has_value() || ((*w)->numel() == D && (*w)->scalar_type() == qkv.scalar_type()),
                "qkv_rope_store: q_norm and k_norm must be [", D, "] in qkv's dtype");
  }
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(3) == num_kv_heads && kv_cache.size(4) == D,
              "qkv_rope_store: kv_cache's heads x head_dim must be ", num_kv_heads, " x ", D);
  TORCH_CHECK(positions.numel() == T, "qkv_rope_store: one position per token expected");
  at::Tensor q = qkv.narrow(1, 0, num_heads * D).view({T, num_heads, D});
  at::Tensor k = qkv.narrow(1, num_heads * D, num_kv_heads * D).view({T, num_kv_heads, D});
  at::Tensor v = qkv.narrow(1, (num_heads + num_kv_heads) * D, num_kv_heads * D).view({T, num_kv_heads, D});
  check_rotary(positions, cos, sin, D, "qkv_rope_store");
  const KvPlanes kv = kv_planes(kv_cache, slot_mapping, T, "qkv_rope_store");
  if (q_norm.has_value()) {  // Qwen3: RMSNorm of each head before rotary
    q.copy_(rms_norm(q.reshape({T * num_heads, D}), *q_norm, eps).view({T, num_heads, D}));
    k.copy_(rms_norm(k.reshape({T * num_kv_heads, D}), *k_norm, eps).view({T, num_kv_heads, D}));
  }
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  // Decode batches stay on the calling thread: the whole step is a few microseconds.
  at::parallel_for(0, T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      rotate_qk(q, k, t, pos[t], cos, sin);
      store_row(k, t, kv.k, slot[t], kv.slot_bytes);
      store_row(v, t, kv.v, slot[t], kv.slot_bytes);
    }
  });
  return {q, k, v};
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
  const int64_t T = k.size(0);
  const KvPlanes kv = kv_planes(kv_cache, slot_mapping, T, "store_kv");
  const int64_t width = kv_cache.size(3) * kv_cache.size(4);
  TORCH_CHECK(k.numel() == T * width && v.numel() == T * width && k.scalar_type() == kv_cache.scalar_type() &&
                  v.scalar_type() == kv_cache.scalar_type(),
              "store_kv: k/v must be [T, Hkv, D] in the cache's dtype");
  const at::Tensor kc = k.reshape({T, width}).contiguous(), vc = v.reshape({T, width}).contiguous();
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    store_row(kc, t, kv.k, slot[t], kv.slot_bytes);
    store_row(vc, t, kv.v, slot[t], kv.slot_bytes);
  }
}

at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0, "argmax_rows: logits must be [N, V] with V > 0");
  if (!avx512::supported() || logits.scalar_type() != at::kFloat || !logits.device().is_cpu()) {
    return logits.argmax(-1);
  }
  const at::Tensor x = logits.stride(1) == 1 ? logits : logits.contiguous();
  at::Tensor out = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, x.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = avx512::argmax(x.data_ptr<float>() + r * x.stride(0), x.size(1));
  });
  return out;
}

void apply_token_bitmask(at::Tensor& logits, const at::Tensor& rows, const at::Tensor& bits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu() &&
                  logits.stride(1) == 1,
              "apply_token_bitmask: logits must be [N, V] fp32 on the CPU with unit-stride rows");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong, "apply_token_bitmask: rows must be [G] int64");
  const int64_t n = logits.size(0), vocab = logits.size(1), words = (vocab + 31) / 32;
  TORCH_CHECK(bits.dim() == 2 && bits.scalar_type() == at::kInt && bits.size(0) == rows.size(0) &&
                  bits.size(1) == words,
              "apply_token_bitmask: bits must be [G, ceil(V/32)] = [", rows.size(0), ", ", words, "] int32");
  const at::Tensor r = rows.contiguous(), b = bits.contiguous();
  const int64_t* row_ids = r.data_ptr<int64_t>();
  for (int64_t g = 0; g < r.size(0); ++g) {
    TORCH_CHECK(row_ids[g] >= 0 && row_ids[g] < n, "apply_token_bitmask: row ", row_ids[g], " out of range [0, ", n,
                ")");
  }
  float* base = logits.data_ptr<float>();
  const auto* masks = reinterpret_cast<const uint32_t*>(b.data_ptr<int32_t>());
  const float banned = -std::numeric_limits<float>::infinity();
  // (rows listed twice get the union of their bans, in any order: every write is -inf)
  const bool vector = avx512::supported();
  at::parallel_for(0, r.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      float* row = base + row_ids[g] * logits.stride(0);
      const uint32_t* mask = masks + g * words;
      if (vector) {
        avx512::ban_unset_bits(row, mask, vocab);
        continue;
      }
      for (int64_t w = 0; w < words; ++w) {
        const uint32_t word = mask[w];
        if (word == 0xffffffffu) continue;  // (most words of a permissive grammar state)
        const int64_t start = w * 32, count = std::min<int64_t>(32, vocab - start);
        for (int64_t j = 0; j < count; ++j) {
          if (!((word >> j) & 1u)) row[start + j] = banned;
        }
      }
    }
  });
}

double cpu_bf16_peak_gflops() { return avx512::bf16_dot_peak_gflops(); }

}  // namespace rtp_llm::ops
