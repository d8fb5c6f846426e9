// Torch-linked compute ops exposed to Python as the librtp_compute_ops extension: the CPU
// kernels (every wheel has them, so --device=cpu works with the CUDA and Ascend wheels too).
#pragma once

#include <optional>
#include <string>
#include <tuple>

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

// Whether paged_attention runs its vectorized (AVX-512) kernel on this CPU for this head_dim,
// query heads per KV head and block size (elsewhere, portable loops).
bool paged_attention_vectorized(int64_t head_dim, int64_t group, int64_t block_size);

// residual += x (in place), then returns rms_norm(residual, weight). x, residual: [N, D].
at::Tensor fused_add_rms_norm(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);

// In place on q: [T, H, D] and k: [T, Hkv, D] (HF's rotate_half layout); positions: [T]
// int64; cos, sin: [max_positions, D / 2] float32.
void rotary_embedding(at::Tensor& q, at::Tensor& k, const at::Tensor& positions, const at::Tensor& cos,
                      const at::Tensor& sin);

// The attention inputs of a fused projection, qkv: [T, (H + 2 Hkv) D] (rows of unit stride),
// in one pass per token: optional per-head RMSNorm of q and k (Qwen3; weights [D]), rotary on
// q and k in place (as rotary_embedding), then k and v into kv_cache at slot_mapping (as
// store_kv; slots unique and in range). Returns views of qkv: q [T, H, D], k and v [T, Hkv, D].
// Every argument is checked before anything is written.
std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_rope_store(const at::Tensor& qkv, int64_t num_heads,
                                                              int64_t num_kv_heads, const at::Tensor& positions,
                                                              const at::Tensor& cos, const at::Tensor& sin,
                                                              at::Tensor& kv_cache, const at::Tensor& slot_mapping,
                                                              const std::optional<at::Tensor>& q_norm,
                                                              const std::optional<at::Tensor>& k_norm, double eps);

// logits: [N, V] -> [N] int64, each row's torch.argmax (the first largest; the first NaN where
// there is one). fp32 rows on the CPU with AVX-512 run 16 lanes at a time (faster than
// torch's); others take torch.argmax.
at::Tensor argmax_rows(const at::Tensor& logits);

// A grammar step's token mask, in place: logits [N, V] fp32 (unit-stride rows, CPU); row rows[g]
// ([G] int64) keeps the tokens whose bit is set in bits[g] ([G, ceil(V/32)] int32, xgrammar's
// layout: bit j of word w allows token 32 w + j), the others become -inf; only banned entries
// are written. Every argument is checked before anything is written.
void apply_token_bitmask(at::Tensor& logits, const at::Tensor& rows, const at::Tensor& bits);

// x: [T, 2 I] (gate, then up) -> silu(gate) * up: [T, I].
at::Tensor silu_and_mul(const at::Tensor& x);

// The CPU cores' bf16 multiply-add peak in GFLOP/s (AVX512-BF16 on registers, on every intra-op
// thread); 0 where the CPU has no bf16 dot-product instruction. A roof for benchmarks.
double cpu_bf16_peak_gflops();

// bf16 projections on the CPU's bf16 dot-product instruction (AVX512-BF16), where it has one.
// pack_bf16_linear: HF's [N, K] weight (N % 16 == 0, K even) -> the kernel's packed layout,
// [N / 16, K / 2, 16, 2]. bf16_linear: x [M, K] (unit stride along K) -> x @ W^T, [M, N], into
// `out` (rows of unit stride) when given.
bool bf16_linear_supported();
at::Tensor pack_bf16_linear(const at::Tensor& weight);
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& out);
// The MLP's first half in one pass: pack_bf16_gate_up of [2 I, K] (gate rows, then up rows;
// I % 16 == 0) -> [I / 16, 2, K / 2, 16, 2]; bf16_linear_silu: x [M, K] -> silu(x gate^T) *
// (x up^T), [M, I], rounded as bf16_linear then silu_and_mul.
at::Tensor pack_bf16_gate_up(const at::Tensor& weight);
at::Tensor bf16_linear_silu(const at::Tensor& x, const at::Tensor& packed);

// GGUF projections of the 32-weight block formats kept quantized (cpu/q8_0.h documents the
// formats and their packed records). pack_q8_0_linear / pack_q4_0_linear / pack_q4_1_linear /
// pack_q5_0_linear / pack_q5_1_linear: the tensor's rows as stored, uint8 [N, K / 32 * 34 / 18 /
// 20 / 22 / 24] -> uint8 [ceil(N / 16), K / 32, 576 / 320 / 384 / 384 / 448]. q8_0_linear: x
// [M, K] fp32 or bf16 -> x @ W^T, [M, n] in x's dtype (into `out` when given), for a weight packed
// from `qtype` ("Q8_0", "Q4_0", ...: the packer's); activations quantized per 32-block to int8 on
// the fly; on AVX-512 VNNI where the CPU has it (q8_0_linear_vectorized()) unless `portable`,
// elsewhere portable C++ (the same bits).
bool q8_0_linear_vectorized();
at::Tensor pack_q8_0_linear(const at::Tensor& blocks);
at::Tensor pack_q4_0_linear(const at::Tensor& blocks);
at::Tensor pack_q4_1_linear(const at::Tensor& blocks);
at::Tensor pack_q5_0_linear(const at::Tensor& blocks);
at::Tensor pack_q5_1_linear(const at::Tensor& blocks);
at::Tensor q8_0_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::string& qtype,
                       const std::optional<at::Tensor>& out, bool portable);

// GGUF Q4_K, Q5_K and Q6_K projections kept quantized (cpu/kquant.h documents the formats and
// the packing): pack_q4_k_linear / pack_q5_k_linear / pack_q6_k_linear take the tensor's rows as
// stored, uint8 [N, K / 256 * 144 / 176 / 210], to uint8 [ceil(N / 16), K / 256, 2368 / 2880 /
// 3392]; q4_k_linear / q5_k_linear / q6_k_linear: x [M, K] fp32 or bf16 -> x @ W^T, [M, n] in x's dtype (into `out`
// when given), activations quantized per 256 to int8 on the fly; the AVX-512 VNNI kernel where
// q8_0_linear_vectorized() unless `portable`, elsewhere portable C++ (the same bits).
at::Tensor pack_q4_k_linear(const at::Tensor& blocks);
at::Tensor pack_q5_k_linear(const at::Tensor& blocks);
at::Tensor pack_q6_k_linear(const at::Tensor& blocks);
at::Tensor q4_k_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& out,
                       bool portable);
at::Tensor q5_k_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& out,
                       bool portable);
at::Tensor q6_k_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& out,
                       bool portable);

// Writes k, v: [T, Hkv, D] to kv_cache: [2, blocks, block_size, Hkv, D] at slot_mapping: [T].
void store_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& kv_cache, const at::Tensor& slot_mapping);

}  // namespace rtp_llm::ops
