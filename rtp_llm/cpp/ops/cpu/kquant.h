// GGUF Q4_K, Q5_K and Q6_K weights kept quantized on the CPU ("k-quants": super-blocks of 256
// weights): the file formats (declared once here), the packed layouts the kernels read, the
// activations' int8 form, and the kernels (portable in kquant_portable.cc, AVX-512 VNNI in
// avx512_kquant.cc) behind kquant_linear.cc's run-time pick.
//
// The file's formats (llama.cpp's block_q4_K / block_q6_K), per row of an [N, K] weight K / 256
// super-blocks of:
//   Q4_K, 144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales sc[8] and mins m[8] (llama.cpp's
//     get_scale_min_k4 packing), 128 bytes of nibbles: for the 64-weight chunk c (0..3), byte
//     32c + l holds weight 64c + l (low nibble) and 64c + 32 + l (high nibble). Sub-block j of 32
//     weights: w = d * sc[j] * q - dmin * m[j], q in [0, 15].
//   Q5_K, 176 bytes: fp16 d, fp16 dmin, Q4_K's 12 bytes of scales and mins, qh[32] (5th bits),
//     then Q4_K's 128 bytes of nibbles: weight 64c + l (l < 32) takes bit 2c of qh[l] as its
//     bit 4, weight 64c + 32 + l bit 2c + 1. Sub-block j: w = d * sc[j] * q - dmin * m[j], q in
//     [0, 31].
//   Q6_K, 210 bytes: ql[128] low nibbles, qh[64] high 2 bits, int8 scales[16], fp16 d. For the
//     128-weight half h (0..1), l in [0, 32) and i in [0, 4), weight 128h + 32i + l has the low
//     nibble (i < 2) or high nibble (i >= 2) of ql[64h + 32 (i & 1) + l] and, as bits 4..5, bits
//     2i..2i+1 of qh[32h + l]. Sub-block j of 16 weights: w = d * scales[j] * (q - 32), q in
//     [0, 63].
//
// Packed (pack_q4_k_linear / pack_q5_k_linear / pack_q6_k_linear), uint8 [ceil(N / 16), K / 256, record bytes]: per
// group of 16 output columns (the last padded with zero columns) and super-block b, one record.
// Weights are stored as the unsigned operand of `vpdpbusd` (activations are the signed one), as
// nibble vectors: vector v (64 bytes) holds, at byte 4c + t, column c's weight 8v + t (low nibble)
// and 8v + 4 + t (high nibble), t in [0, 4): one load feeds two `vpdpbusd`.
//   Q4_K record (kQ4KRecordBytes = 2368, 37 cache lines; the file's 16 x 144 = 2304):
//     [0, 2048)     32 nibble vectors of q;
//     [2048, 2176)  scales sc as uint8 [8 sub-blocks][16 columns];
//     [2176, 2304)  mins m as uint8 [8][16];
//     [2304, 2336)  d, fp16 [16]; [2336, 2368) dmin, fp16 [16].
//   Q5_K record (kQ5KRecordBytes = 2880, 45 cache lines; the file's 16 x 176 = 2816): Q4_K's
//     nibble vectors, then [2048, 2560) the 5th bits: per nibble vector v two little-endian
//     uint64, its low-nibble operand's then its high-nibble operand's, bit i that operand's
//     byte i's; then scales, mins, d and dmin as Q4_K's, 512 bytes on.
//   Q6_K record (kQ6KRecordBytes = 3392, 53 cache lines; the file's 16 x 210 = 3360, padded to a line):
//     [0, 2048)     32 nibble vectors of q & 15;
//     [2048, 3072)  16 high-bit vectors: vector u, byte 4c + t, bits 2i..2i+1 = column c's
//                   (q >> 4) of weight 16u + 4i + t (i in [0, 4)), so q's of one 16-weight
//                   sub-block come from one high-bit and two nibble vectors;
//     [3072, 3328)  scales, int8 [16 sub-blocks][16 columns];
//     [3328, 3360)  d, fp16 [16]; [3360, 3392) zero.
#pragma once

#include <cstdint>

namespace rtp_llm::ops::kquant {

constexpr int kSuper = 256;                   // weights per super-block (one activation scale each)
constexpr int kGroupCols = 16;                // output columns per packed group
constexpr int kNibbleBytes = kGroupCols * kSuper / 2;  // 2048: 32 nibble vectors

constexpr int kQ4KFileBytes = 144;
constexpr int kQ4KSub = 32;                   // weights per Q4_K sub-block (a scale and a min each)
constexpr int kQ4KSubs = kSuper / kQ4KSub;    // 8
constexpr int kQ4KScalesOffset = kNibbleBytes;
constexpr int kQ4KMinsOffset = kQ4KScalesOffset + kQ4KSubs * kGroupCols;
constexpr int kQ4KDOffset = kQ4KMinsOffset + kQ4KSubs * kGroupCols;
constexpr int kQ4KDminOffset = kQ4KDOffset + 2 * kGroupCols;
constexpr int kQ4KRecordBytes = kQ4KDminOffset + 2 * kGroupCols;  // 2368

// Q4_K's and Q5_K's records (the same scales, mins and scale layout): byte offsets by format.
struct SubScaledRecord {
  int high, scales, mins, d, dmin, bytes;  // high: the 5th-bit plane (-1: none)
};
constexpr SubScaledRecord kQ4KRecord{-1, kQ4KScalesOffset, kQ4KMinsOffset, kQ4KDOffset, kQ4KDminOffset, kQ4KRecordBytes};
constexpr int kQ5KFileBytes = 176;
constexpr int kQ5KPlaneBytes = 2 * (kNibbleBytes / 64) * 8;  // 512: a uint64 per `vpdpbusd` operand
constexpr SubScaledRecord kQ5KRecord{kNibbleBytes, kQ4KScalesOffset + kQ5KPlaneBytes, kQ4KMinsOffset + kQ5KPlaneBytes,
                                     kQ4KDOffset + kQ5KPlaneBytes, kQ4KDminOffset + kQ5KPlaneBytes,
                                     kQ4KRecordBytes + kQ5KPlaneBytes};  // 2880
constexpr int kQ5KRecordBytes = kQ5KRecord.bytes;

constexpr int kQ6KFileBytes = 210;
constexpr int kQ6KSub = 16;                   // weights per Q6_K sub-block (an int8 scale each)
constexpr int kQ6KSubs = kSuper / kQ6KSub;    // 16
constexpr int kQ6KHighOffset = kNibbleBytes;
constexpr int kQ6KScalesOffset = kQ6KHighOffset + kQ6KSubs * 64;
constexpr int kQ6KDOffset = kQ6KScalesOffset + kQ6KSubs * kGroupCols;
constexpr int kQ6KRecordBytes = kQ6KDOffset + 2 * kGroupCols + 32;  // 3392
constexpr int kQ6KBias = 32;                  // w = d * sc * (q - 32)

// Activations, per row and super-block (llama.cpp's Q8_K idea): d = max|x| / kQMax, q =
// round-to-nearest-even(x * (1 / d)) in [-127, 127], and the sums of q per 16 (Q6_K subtracts
// 32 x the sum, Q4_K's mins multiply sums of two).
constexpr float kQMax = 127.f;
constexpr int kSumsPerSuper = kSuper / 16;

struct Activations {
  int8_t* q;      // [M, K]
  float* d;       // [M, K / 256]
  int32_t* sums;  // [M, K / 16]
};

// Quantizes rows x [M, K] (row stride ldx) into a (the two kernels share it, so their inputs
// agree bit for bit).
void quantize_activations(const float* x, int64_t ldx, int64_t M, int64_t K, const Activations& a);

enum class Format { kQ4K, kQ5K, kQ6K };

constexpr int record_bytes(Format f) {
  return f == Format::kQ4K ? kQ4KRecordBytes : f == Format::kQ5K ? kQ5KRecordBytes : kQ6KRecordBytes;
}

// One call's operands: x [M, K] fp32 (row stride ldx), the packed weight of N columns, out
// [M, N] fp32 (row stride ldo). K % 256 == 0.
struct Gemm {
  const float* x;
  int64_t ldx;
  const uint8_t* w;
  float* out;
  int64_t ldo;
  int64_t M, N, K;
};

// Rows per panel: the threads split (panel, group) units, as the Q8_0 kernels do.
constexpr int64_t kPanelRows = 256;

// The integer arithmetic both kernels do, per (row, column, super-block), exact in int32:
//   Q4_K, Q5_K: s1 = sum_j sc[j] * sum_{32} q_w q_x, s2 = sum_j m[j] * sum_{32} q_x; then
//         acc = fma(float(s1), d * d_x, acc); acc = fma(-float(s2), dmin * d_x, acc).
//         |s1| <= 8 * 63 * 32 * 31 * 127 < 2^26.
//   Q6_K: s = sum_j sc[j] * (sum_{16} q_w q_x - 32 * sum_{16} q_x); acc = fma(float(s), d * d_x, acc).
//         |s| <= 16 * 128 * 16 * 32 * 127 < 2^28.
// The same fp32 operations in the same order: the two kernels agree to the last bit.
void gemm_portable(Format f, const Gemm& g);

}  // namespace rtp_llm::ops::kquant

namespace rtp_llm::ops::avx512 {

// ... and on `vpdpbusd` (callers check q8_0_vnni_supported(): the same AVX-512 VNNI gate).
void kquant_gemm(kquant::Format f, const kquant::Gemm& g);

}  // namespace rtp_llm::ops::avx512
