// AVX-512 versions of the CPU kernels' inner loops, on raw pointers, by family:
// avx512_attention.cc (paged attention), avx512_gemm.cc (bf16 GEMM), avx512_row_ops.cc (norms,
// rotary, SiLU-and-mul, argmax); avx512.cc says whether this CPU runs them. The portable
// kernels (paged_attention.cc, bf16_linear.cc, fused_ops.cc, rms_norm.cc) call these when the
// running CPU has AVX-512 (F, BW, DQ, VL) and fall back to their own loops elsewhere (AVX2,
// aarch64).
// GCC does not vectorize the portable loops well: bf16 <-> fp32 bit casts and expf stay
// scalar, and a dot product per key ends in a horizontal reduction.
#pragma once

#include <cstdint>
#include <optional>

#include <c10/core/ScalarType.h>

namespace rtp_llm::ops::avx512 {

// Storage dtype of the tensors a kernel reads and writes; arithmetic is fp32.
enum class Dtype { kF32, kBF16, kF16 };

// The kernels' dtype for a tensor's, or nullopt when they have none for it.
inline std::optional<Dtype> dtype_of(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return Dtype::kF32;
    case c10::kBFloat16: return Dtype::kBF16;
    case c10::kHalf: return Dtype::kF16;
    default: return std::nullopt;
  }
}

// The dtype for the AVX-512 kernels when this CPU runs them and they have the tensor's dtype.
std::optional<Dtype> usable_for(c10::ScalarType t);

// True when this process may call the functions below (checked once via CPUID).
bool supported();

// Head dims the attention kernel is specialized for; others use the portable kernel.
bool attention_supports(int head_dim, int group, int block_size);

// Query heads one attend() call takes at most: (kv_head_end - kv_head_begin) x group.
constexpr int kMaxItemHeads = 32;

// What every item of one paged-attention call shares. Caches are [blocks, block_size,
// num_kv_heads, head_dim]; q and out have query heads q_head_stride elements apart, head_dim
// contiguous.
struct AttendShape {
  int num_kv_heads, group, head_dim, block_size;
  float scale;
  int64_t q_head_stride;
};

// One item of paged attention, a query token and KV heads [kv_head_begin, kv_head_end): their
// groups' query heads at q (the first is kv_head_begin's first) attend keys [0, pos] of the
// stream whose blocks are block_table; online softmax in fp32; out as q.
struct AttendItem {
  const void* q;
  void* out;
  const int32_t* block_table;
  int pos;
  int kv_head_begin, kv_head_end;
  // Whether to prefetch the item's blocks: a decode token's are read once per step, from
  // memory; a prompt's tokens read their stream's blocks one after another, from cache
  // (prefetching them made prompts slower: docs/benchmarks.md).
  bool prefetch;
};

// Runs `item`. Its K/V blocks are prefetched into L2 ahead of their use where item.prefetch:
// across items too, so `next` is the item the calling thread runs after this one (nullptr:
// none), whose first blocks this one's last blocks prefetch; `first`: no item before this one
// prefetched its blocks.
void attend(Dtype dtype, const void* k_cache, const void* v_cache, const AttendShape& shape, const AttendItem& item,
            const AttendItem* next, bool first);

// rows x dim, contiguous. out = round(round(x * rsqrt(mean(x^2) + eps)) * w) (HF's order).
void rms_norm(Dtype dtype, const void* x, const void* w, void* out, int64_t rows, int64_t dim, float eps);

// residual = round(residual + x) in place, then out = rms_norm(residual).
void add_rms_norm(Dtype dtype, const void* x, void* residual, const void* w, void* out, int64_t rows, int64_t dim,
                  float eps);

// In place, one token's `heads` head rows, head_stride elements apart: each half-pair (x1, x2)
// -> (x1 cos - x2 sin, x2 cos + x1 sin) (HF's rotate_half layout), in fp32, rounded once;
// cos, sin: [half] fp32.
void rotate_heads(Dtype dtype, void* x, int64_t heads, int64_t head_stride, int64_t half, const float* cos,
                  const float* sin);

// Index of the first largest of x's n (> 0) floats, or of the first NaN (torch.argmax's).
int64_t argmax(const float* x, int64_t n);

// row[t] = -inf for each t < n whose bit is clear in mask (bit t % 32 of word t / 32): a grammar
// mask's bans, two masked 16-lane stores a word.
void ban_unset_bits(float* row, const uint32_t* mask, int64_t n);

// Elements [begin, end) of out: [rows, inter] = round(round(silu(gate)) * up), x: [rows, 2 inter].
void silu_and_mul(Dtype dtype, const void* x, void* out, int64_t inter, int64_t begin, int64_t end);

// The cores' bf16 multiply-add peak in GFLOP/s: `vdpbf16ps` on registers only (independent
// accumulators, no memory), on every intra-op thread at once; 0 without AVX512-BF16. What a
// bf16 GEMM could reach at best (a roof for benchmarks), not what a library's GEMM reaches.
double bf16_dot_peak_gflops();

// True when this process may call bf16_gemm (AVX512-BF16; RTP_LLM_CPU_AVX512=0 says no).
bool bf16_gemm_supported();

// out[M, N] = x[M, K] @ W^T in bf16 (fp32 sums of exact products, `vdpbf16ps`, which flushes
// subnormal inputs and sums to zero; rounded to nearest even once), on every intra-op thread.
// x, out: rows of unit stride, row strides ldx, ldo. W is packed [N / 16][K / 2][16][2]: per
// block of 16 output columns and pair of k, the 16 columns' two weights side by side (one
// 64-byte line, one `vdpbf16ps` operand). N % 16 == 0, K % 2 == 0.
void bf16_gemm(const uint16_t* x, int64_t ldx, const uint16_t* w_packed, uint16_t* out, int64_t ldo, int64_t M,
               int64_t N, int64_t K);

// The MLP's first half in one GEMM: out[M, N / 2] = silu(x W_gate^T) * (x W_up^T), rounded as
// bf16_gemm and then silu_and_mul would. W packed as bf16_gemm's, of the [N, K] weight whose
// 16-row blocks alternate gate rows 16j.. and up rows 16j.. (pack_bf16_gate_up). N % 32 == 0.
void bf16_gemm_silu(const uint16_t* x, int64_t ldx, const uint16_t* w_packed, uint16_t* out, int64_t ldo, int64_t M,
                    int64_t N, int64_t K);

}  // namespace rtp_llm::ops::avx512
