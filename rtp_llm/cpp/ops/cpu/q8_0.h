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
// of whole cache lines. Every format is w = d * q (+ m), q an int8 (Q8_0 q as stored; Q4_0 nib - 8;
// Q5_0 q5 - 16; Q4_1 nib and Q5_1 q5 with their m), and the kernels consume q as 8 `vpdpbusd`
// operands of 64 bytes, operand t holding column 16g + c's weights k = 32b + 4t .. + 3 at byte 4c.
// Q8_0's record (wide, 576 bytes: 1.125 per weight, the file's 1.0625) stores those operands as
// int8; the 4- and 5-bit formats' records (narrow) store each byte's q + zero as a nibble (and a
// 5th bit), so a decode step reads about the file's bytes:
//   bytes [0, 256) (narrow): 4 chunks of 64; chunk j's byte i holds operand 2j's byte i in its
//                  low nibble and operand 2j + 1's in its high nibble;
//   bytes [256, 320) (5-bit only): per operand t a little-endian uint64, bit i its byte i's 5th bit;
//   then d (16 fp16), the int16 sums of the 32 q of each column (the VNNI kernel feeds
//   activations offset by +128 as unsigned bytes and subtracts 128 x the sum), and for formats
//   with a min m (16 fp16), zero-padded to a whole cache line.
//   bytes per record (per weight; the file's): Q8_0 576 (1.125; 1.0625), Q4_0 320 (0.625; 0.5625),
//   Q4_1 384 (0.75; 0.625), Q5_0 384 (0.75; 0.6875), Q5_1 448 (0.875; 0.75).
// The packing is exact (d and m are the file's fp16 bits). A narrow record is unpacked in
// registers to the very q a wide one would hold, so every format runs the same integer sums and
// fp32 operations in the same order.
#pragma once

#include <cstdint>

namespace rtp_llm::ops::q8_0 {

constexpr int kBlock = 32;                    // weights per block (a scale each)
constexpr int kFileBlockBytes = 2 + kBlock;   // Q8_0: fp16 d + 32 int8
constexpr int kGroupCols = 16;                // output columns per packed group
constexpr int kQuadsPerBlock = kBlock / 4;    // `vpdpbusd` operands per block
constexpr int kOperandBytes = 64;             // kGroupCols x 4
constexpr int kQsBytes = kGroupCols * kBlock;  // 512: the operands as int8 (wide)
constexpr int kNibbleBytes = kQsBytes / 2;     // 256: as nibbles (narrow)
constexpr int kPlaneBytes = kQuadsPerBlock * 8;  // 64: the 5th bits, a uint64 per operand

enum class Format { kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1 };

// A format's record (the layout above): q's bits as stored (8: int8 operands; 4 or 5: nibbles,
// and a bit plane for 5), the zero point taken off them, and the byte offsets of d, the sums and
// m (-1: no min).
struct Record {
  int bytes, bits, zero, scales, sums, mins;
};

constexpr Record record_of(Format f) {
  switch (f) {
    case Format::kQ4_0: return {320, 4, 8, kNibbleBytes, kNibbleBytes + 32, -1};
    case Format::kQ4_1: return {384, 4, 0, kNibbleBytes, kNibbleBytes + 32, kNibbleBytes + 64};
    case Format::kQ5_0: return {384, 5, 16, kNibbleBytes + kPlaneBytes, kNibbleBytes + kPlaneBytes + 32, -1};
    case Format::kQ5_1:
      return {448, 5, 0, kNibbleBytes + kPlaneBytes, kNibbleBytes + kPlaneBytes + 32, kNibbleBytes + kPlaneBytes + 64};
    default: return {576, 8, 0, kQsBytes, kQsBytes + 32, -1};
  }
}

// The file formats' bytes per 32-block (d, m, qh offsets follow from the layouts above).
constexpr int kQ4_0FileBytes = 18;
constexpr int kQ4_1FileBytes = 20;
constexpr int kQ5_0FileBytes = 22;
constexpr int kQ5_1FileBytes = 24;

// Activations are quantized per row and block as llama.cpp's q8_0: d = max|x| / kQMax,
// q = round-to-nearest-even(x / d) in [-kQMax, kQMax]; with a min the kernels also take the
// block's sum of q (exact in int32).
constexpr float kQMax = 127.f;

// One call's operands: x [M, K] fp32 (row stride ldx), the packed weight of N columns in
// `format`'s records, out [M, N] fp32 (row stride ldo). K % kBlock == 0.
struct Gemm {
  const float* x;
  int64_t ldx;
  const uint8_t* w;
  float* out;
  int64_t ldo;
  int64_t M, N, K;
  Format format;
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
