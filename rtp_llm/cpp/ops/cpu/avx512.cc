// Whether this CPU runs the AVX-512 kernels (avx512_attention.cc, avx512_gemm.cc,
// avx512_row_ops.cc, avx512_q8_0.cc): checked once via CPUID, compiled for the baseline ISA
// (it runs on every CPU).
#include "rtp_llm/cpp/ops/cpu/avx512.h"
#include "rtp_llm/cpp/ops/cpu/q8_0.h"

#include <cstdlib>
#include <cstring>

namespace rtp_llm::ops::avx512 {

#if defined(__x86_64__)

namespace {

bool disabled_by_env() {
  const char* v = std::getenv("RTP_LLM_CPU_AVX512");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace

bool supported() {
  // RTP_LLM_CPU_AVX512=0 runs the portable kernels (their tests; comparing speed).
  static const bool ok = !disabled_by_env() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return ok;
}

bool bf16_gemm_supported() {
  static const bool ok = supported() && __builtin_cpu_supports("avx512bf16");
  return ok;
}

bool q8_0_vnni_supported() {
  static const bool ok = supported() && __builtin_cpu_supports("avx512vnni");
  return ok;
}

#else  // not x86_64: the portable kernels run

bool supported() { return false; }
bool bf16_gemm_supported() { return false; }
bool q8_0_vnni_supported() { return false; }

#endif

std::optional<Dtype> usable_for(c10::ScalarType t) { return supported() ? dtype_of(t) : std::nullopt; }

}  // namespace rtp_llm::ops::avx512
