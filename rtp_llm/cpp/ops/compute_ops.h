// Torch-linked compute ops exposed to Python as the librtp_compute_ops extension.
// Device-specific sources are selected by arch_config/arch_select.bzl:compute_ops_srcs.
#pragma once

#include <ATen/ATen.h>

namespace rtp_llm::ops {

// x: [num_tokens, hidden], weight: [hidden] -> x * rsqrt(mean(x^2) + eps) * weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace rtp_llm::ops
