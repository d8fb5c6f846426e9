// GGUF weights of the 32-weight block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) kept quantized on
// the CPU: the file formats (declared once here), the one packed layout every one of them is
// unpacked to, and the two kernels (portable in q8_0_portable.cc, AVX-512 VNNI in
// avx512_q8_0.cc) behind q8_0_linear's run-time pick (q8_0_linear.cc); the packing of every
// format in block32_pack.cc.
//
// The files' formats (llama.cpp's block_q8_0 / q4_0 / q4_1 / q5_0 / q5_1): each row of an [N, K]
// weight is K / 32 blocks of (fp16 d, then for _1 formats fp16 m) and
//   Q8_0, 34 bytes: 32 int8 q; w[k] = d * q[k].
//   Q4_0, 18 bytes: 16 bytes of nibbles, byte j holding weight j (low) and j + 16 (high);
//                   w = d * (nib - 8).
//   Q4_1, 20 bytes: nibbles as Q4_0; w = d * nib + m.
//   Q5_0, 22 bytes: uint32 qh (bit k: weight k's 5th bit), then nibbles as Q4_0;
//                   w = d * (q5 - 16).
//   Q5_1, 24 bytes: qh and nibbles as Q5_0; w = d * q5 + m.
//
// Packed (pack_q8_0_linear, pack_q4_0_linear, ...), uint8 [ceil(N / 16), K / 32, record]: per
// group of 16 output columns (the last padded with zero columns) and block b of 32 k, one record
// of 9 cache lines (576 bytes) or, for formats with a min, 10 (640):
//   bytes [0, 512):   q as int8, [8 quads][16 columns][4]: column 16g + c's weights k = 32b + 4t
//                     .. + 3 at 64t + 4c (one `vpdpbusd` operand per quad of k);
//   bytes [512, 544): the 16 columns' fp16 scales d;
//   bytes [544, 576): the 16 columns' int16 sums of their 32 q (the VNNI kernel feeds
//                     activations offset by +128 as unsigned bytes and subtracts 128 x the sum);
//   with a min:
//   bytes [576, 608): the 16 columns' fp16 mins m; [608, 640): zero.
// Every format is w = d * q (+ m): Q8_0 q as stored; Q4_0 nib - 8; Q5_0 q5 - 16; Q4_1 nib and
// Q5_1 q5 with their m. The unpacking is exact (d and m are the file's fp16 bits), so one kernel
// serves them all. Bytes per weight packed (the file's): Q8_0 1.125 (1.0625), Q4_0 and Q5_0
// 1.125 (0.5625, 0.6875), Q4_1 and Q5_1 1.25 (0.625, 0.75): the 4- and 5-bit formats read about
// twice the file's bytes (still 0.56-0.63 of bf16's) for one int8 kernel with no unpacking in
// its inner loop.
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
constexpr int kMinsOffset = kPackedBlockBytes;                    // 16 fp16 (formats with a min)
constexpr int kPackedMinBlockBytes = kMinsOffset + 64;            // 640 = 10 x 64

// The file formats' bytes per 32-block (d, m, qh offsets follow from the layouts above).
constexpr int kQ4_0FileBytes = 18;
constexpr int kQ4_1FileBytes = 20;
constexpr int kQ5_0FileBytes = 22;
constexpr int kQ5_1FileBytes = 24;

// Activations are quantized per row and block as llama.cpp's q8_0: d = max|x| / kQMax,
// q = round-to-nearest-even(x / d) in [-kQMax, kQMax]; with a min the kernels also take the
// block's sum of q (exact in int32).
constexpr float kQMax = 127.f;

// One call's operands: x [M, K] fp32 (row stride ldx), the packed weight of N columns, out
// [M, N] fp32 (row stride ldo). K % kBlock == 0. `mins`: the records are kPackedMinBlockBytes
// with m (else kPackedBlockBytes).
struct Gemm {
  const float* x;
  int64_t ldx;
  const uint8_t* w;
  float* out;
  int64_t ldo;
  int64_t M, N, K;
  bool mins;
};

// The arithmetic both kernels do, per (row, column, block), in this order: s = sum_32 q_w q_x
// (exact int32), acc = fma(float(s), d * d_x, acc); with a min then acc = fma(float(sum_32 q_x),
// m * d_x, acc). The same fp32 operations in the same order: the two kernels agree to the last bit.

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
