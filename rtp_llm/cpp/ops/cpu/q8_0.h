// GGUF Q8_0 weights kept quantized on the CPU: the block format (declared once here), the
// packed layout the kernels read, and the two kernels (portable in q8_0_linear.cc, AVX-512
// VNNI in avx512_q8_0.cc) behind q8_0_linear's run-time pick.
//
// The file's format (llama.cpp's block_q8_0): each row of an [N, K] weight is K / 32 blocks of
// kFileBlockBytes: an fp16 scale d, then 32 int8 q; w[k] = d * q[k].
//
// Packed (pack_q8_0_linear), uint8 [ceil(N / 16), K / 32, kPackedBlockBytes]: per group of 16
// output columns (the last padded with zero columns) and block b of 32 k, one 576-byte record
// of 9 cache lines:
//   bytes [0, 512):   q, [8 quads][16 columns][4]: column 16g + c's weights k = 32b + 4t .. + 3
//                     at 64t + 4c (one `vpdpbusd` operand per quad of k);
//   bytes [512, 544): the 16 columns' fp16 scales d;
//   bytes [544, 576): the 16 columns' int16 sums of their 32 q (the VNNI kernel feeds
//                     activations offset by +128 as unsigned bytes and subtracts 128 x the sum).
#pragma once

#include <cstdint>

namespace rtp_llm::ops::q8_0 {

constexpr int kBlock = 32;                                // weights per block (a scale each)
constexpr int kFileBlockBytes = 2 + kBlock;               // fp16 d + 32 int8
constexpr int kGroupCols = 16;                            // output columns per packed group
constexpr int kQuadsPerBlock = kBlock / 4;                // `vpdpbusd` operands per block
constexpr int kQsBytes = kGroupCols * kBlock;             // 512
constexpr int kScalesOffset = kQsBytes;                   // 16 fp16
constexpr int kSumsOffset = kScalesOffset + 2 * kGroupCols;  // 16 int16
constexpr int kPackedBlockBytes = kSumsOffset + 2 * kGroupCols;  // 576 = 9 x 64
// Activations are quantized per row and block as llama.cpp's q8_0: d = max|x| / kQMax,
// q = round-to-nearest-even(x / d) in [-kQMax, kQMax].
constexpr float kQMax = 127.f;

// One call's operands: x [M, K] fp32 (row stride ldx), the packed weight of N columns, out
// [M, N] fp32 (row stride ldo). K % kBlock == 0.
struct Gemm {
  const float* x;
  int64_t ldx;
  const uint8_t* w;
  float* out;
  int64_t ldo;
  int64_t M, N, K;
};

// Rows per panel: the threads split (panel, group) units; a panel's quantized rows stay in
// cache while a group's blocks are read once per panel.
constexpr int64_t kPanelRows = 256;

// out = x @ W^T with activations quantized on the fly. Portable C++ (any CPU) ...
void gemm_portable(const Gemm& g);

}  // namespace rtp_llm::ops::q8_0

namespace rtp_llm::ops::avx512 {

// True when this process may call q8_0_gemm (AVX-512 F/BW/DQ/VL and VNNI; RTP_LLM_CPU_AVX512=0
// says no).
bool q8_0_vnni_supported();

// ... and on `vpdpbusd` (same integer sums as the portable kernel, same fp32 roundings: the two
// agree to the last bit).
void q8_0_gemm(const q8_0::Gemm& g);

}  // namespace rtp_llm::ops::avx512
