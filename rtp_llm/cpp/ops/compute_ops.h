// Torch-linked compute ops exposed to Python as the librtp_compute_ops extension.
// Device-specific sources are selected by arch_config/arch_select.bzl:compute_ops_srcs.
#pragma once

#include <ATen/ATen.h>

namespace rtp_llm::ops {

// x: [num_tokens, hidden], weight: [hidden] -> x * rsqrt(mean(x^2) + eps) * weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Attention of each query token over its stream's paged KV cache, causal by position.
// q: [T, H, D]; k_cache, v_cache: [blocks, block_size, Hkv, D]; block_tables: [S, B] int32;
// query_starts: [S + 1] int32 (stream s owns tokens [starts[s], starts[s+1])); context_lens:
// [S] int32 (KV length after this step, i.e. the last token's position + 1) -> [T, H, D].
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& query_starts,
                           const at::Tensor& context_lens, double scale);

}  // namespace rtp_llm::ops
