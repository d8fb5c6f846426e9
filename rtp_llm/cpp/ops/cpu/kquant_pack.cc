// Q4_K / Q5_K / Q6_K weights (kquant.h): a GGUF tensor's super-blocks, as stored, into the kernels'
// packed records. Each file super-block is first unpacked to plain per-weight quants and
// per-sub-block scales, then written to its column's place in the record; the packing is a
// pure rearrangement (no value changes), done once at load.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>

#include "rtp_llm/cpp/ops/compute_ops.h"
#include "rtp_llm/cpp/ops/cpu/kquant.h"

namespace rtp_llm::ops {
namespace {

using namespace kquant;

// One file super-block, unpacked: q[k] the unsigned quant of weight k, sc / m per sub-block
// (Q4_K: 8 scales and mins; Q6_K: 16 scales as int8 bit patterns, no mins).
struct Unpacked {
  uint8_t q[kSuper];
  uint8_t sc[kQ6KSubs];
  uint8_t m[kQ4KSubs];
};

// llama.cpp's get_scale_min_k4: 6-bit scale and min of sub-block j from the 12 bytes s.
void q4_k_scale_min(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void unpack_q4_k(const uint8_t* blk, Unpacked& u) {
  const uint8_t* scales = blk + 4;
  const uint8_t* qs = blk + 16;
  for (int j = 0; j < kQ4KSubs; j++) q4_k_scale_min(j, scales, &u.sc[j], &u.m[j]);
  for (int c = 0; c < 4; c++)  // 64-weight chunks: low nibbles first, then high
    for (int l = 0; l < 32; l++) {
      u.q[64 * c + l] = qs[32 * c + l] & 0xF;
      u.q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
    }
}

void unpack_q5_k(const uint8_t* blk, Unpacked& u) {
  const uint8_t* scales = blk + 4;
  const uint8_t* qh = blk + 16;
  const uint8_t* qs = blk + 48;
  for (int j = 0; j < kQ4KSubs; j++) q4_k_scale_min(j, scales, &u.sc[j], &u.m[j]);
  for (int c = 0; c < 4; c++)
    for (int l = 0; l < 32; l++) {
      u.q[64 * c + l] = static_cast<uint8_t>((qs[32 * c + l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4));
      u.q[64 * c + 32 + l] = static_cast<uint8_t>((qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4));
    }
}

void unpack_q6_k(const uint8_t* blk, Unpacked& u) {
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  std::memcpy(u.sc, blk + 192, kQ6KSubs);
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 4; i++)
      for (int l = 0; l < 32; l++) {
        const uint8_t byte = ql[64 * h + 32 * (i & 1) + l];
        const uint8_t low = i < 2 ? byte & 0xF : byte >> 4;
        const uint8_t high = (qh[32 * h + l] >> (2 * i)) & 3;
        u.q[128 * h + 32 * i + l] = static_cast<uint8_t>(low | (high << 4));
      }
}

// Column c's low 4 bits of q into the record's nibble vectors (kquant.h).
void put_nibbles(uint8_t* rec, int c, const uint8_t* q) {
  for (int k = 0; k < kSuper; k++) {
    const int v = k / 8, t = k % 8;
    uint8_t& byte = rec[64 * v + 4 * c + t % 4];
    byte |= static_cast<uint8_t>((q[k] & 0xF) << (t < 4 ? 0 : 4));
  }
}

// Column c's bit 4 of q into the Q5_K record's bit plane: nibble vector v's low operand (weights
// 8v + t, t < 4) then its high one (8v + 4 + t), bit 4c + t % 4 of each operand's uint64.
void put_plane(uint8_t* rec, int c, const uint8_t* q) {
  for (int k = 0; k < kSuper; k++) {
    const int operand = 2 * (k / 8) + k % 8 / 4, bit = 4 * c + k % 4;
    rec[kQ5KRecord.high + 8 * operand + bit / 8] |= static_cast<uint8_t>(((q[k] >> 4) & 1) << (bit % 8));
  }
}

// Column c's bits 4..5 of q into the Q6_K record's high-bit vectors.
void put_high_bits(uint8_t* rec, int c, const uint8_t* q) {
  for (int k = 0; k < kSuper; k++) {
    const int u = k / 16, i = k % 16 / 4, t = k % 4;
    rec[kQ6KHighOffset + 64 * u + 4 * c + t] |= static_cast<uint8_t>((q[k] >> 4) << (2 * i));
  }
}

// Q4_K's and Q5_K's scales, mins, d and dmin (the file's first 4 bytes) into layout r.
void put_sub_scales(const Unpacked& u, const uint8_t* blk, const SubScaledRecord& r, uint8_t* rec, int c) {
  for (int j = 0; j < kQ4KSubs; j++) {
    rec[r.scales + kGroupCols * j + c] = u.sc[j];
    rec[r.mins + kGroupCols * j + c] = u.m[j];
  }
  std::memcpy(rec + r.d + 2 * c, blk, 2);
  std::memcpy(rec + r.dmin + 2 * c, blk + 2, 2);
}

void pack_q4_k_column(const uint8_t* blk, uint8_t* rec, int c) {
  Unpacked u;
  unpack_q4_k(blk, u);
  put_nibbles(rec, c, u.q);
  put_sub_scales(u, blk, kQ4KRecord, rec, c);
}

void pack_q5_k_column(const uint8_t* blk, uint8_t* rec, int c) {
  Unpacked u;
  unpack_q5_k(blk, u);
  put_nibbles(rec, c, u.q);
  put_plane(rec, c, u.q);
  put_sub_scales(u, blk, kQ5KRecord, rec, c);
}

void pack_q6_k_column(const uint8_t* blk, uint8_t* rec, int c) {
  Unpacked u;
  unpack_q6_k(blk, u);
  put_nibbles(rec, c, u.q);
  put_high_bits(rec, c, u.q);
  for (int j = 0; j < kQ6KSubs; j++) rec[kQ6KScalesOffset + kGroupCols * j + c] = u.sc[j];
  std::memcpy(rec + kQ6KDOffset + 2 * c, blk + 208, 2);
}

using PackColumn = void (*)(const uint8_t*, uint8_t*, int);

at::Tensor pack(const at::Tensor& blocks, const char* fn, const char* type, int file_bytes, int record_bytes,
                PackColumn pack_column) {
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte && blocks.device().is_cpu() &&
                  blocks.size(1) > 0 && blocks.size(1) % file_bytes == 0,
              fn, ": blocks must be a uint8 [N, K / 256 * ", file_bytes, "] on the CPU (a GGUF ", type,
              " tensor's rows), got ", blocks.sizes());
  const at::Tensor raw = blocks.contiguous();
  const int64_t n = raw.size(0), nb = raw.size(1) / file_bytes, groups = (n + kGroupCols - 1) / kGroupCols;
  at::Tensor packed = at::zeros({groups, nb, record_bytes}, raw.options());  // padded columns stay 0
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = packed.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; g++)
      for (int c = 0; c < kGroupCols && g * kGroupCols + c < n; c++)
        for (int64_t b = 0; b < nb; b++)
          pack_column(src + (g * kGroupCols + c) * raw.size(1) + b * file_bytes, dst + (g * nb + b) * record_bytes, c);
  });
  return packed;
}

}  // namespace

at::Tensor pack_q4_k_linear(const at::Tensor& blocks) {
  return pack(blocks, "pack_q4_k_linear", "Q4_K", kQ4KFileBytes, kQ4KRecordBytes, pack_q4_k_column);
}

at::Tensor pack_q5_k_linear(const at::Tensor& blocks) {
  return pack(blocks, "pack_q5_k_linear", "Q5_K", kQ5KFileBytes, kQ5KRecordBytes, pack_q5_k_column);
}

at::Tensor pack_q6_k_linear(const at::Tensor& blocks) {
  return pack(blocks, "pack_q6_k_linear", "Q6_K", kQ6KFileBytes, kQ6KRecordBytes, pack_q6_k_column);
}

}  // namespace rtp_llm::ops
