// The 32-block formats' weights (q8_0.h): a GGUF tensor's blocks, as stored, into their format's
// packed records. Each file block is first unpacked to 32 int8 q with w = d * q (+ m) (4- and
// 5-bit quants shifted by their format's zero point, which fits int8 exactly), then written to
// its column's place in the record: as int8 (Q8_0) or as q + zero in nibbles and a bit plane (the
// narrow records); d and m keep the file's fp16 bits. Done once at load.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>

#include "rtp_llm/cpp/ops/compute_ops.h"
#include "rtp_llm/cpp/ops/cpu/q8_0.h"

namespace rtp_llm::ops {
namespace {

using namespace q8_0;

// One file block, unpacked: w[k] = d * q[k] (+ m). d and m point at the file's fp16 bits (m is
// null for formats without a min).
struct Unpacked {
  int8_t q[kBlock];
  const uint8_t* d;
  const uint8_t* m;
};

void unpack_q8_0(const uint8_t* blk, Unpacked& u) {
  std::memcpy(u.q, blk + 2, kBlock);
  u.d = blk;
  u.m = nullptr;
}

// The nibbles of 4- and 5-bit blocks: byte j holds weight j (low) and j + 16 (high); qh, where
// there is one, bit k is weight k's 5th bit. `zero` is subtracted (Q4_0: 8, Q5_0: 16; 0 with m).
void unpack_nibbles(const uint8_t* qs, const uint8_t* qh, int zero, Unpacked& u) {
  uint32_t high = 0;
  if (qh != nullptr) std::memcpy(&high, qh, sizeof(high));  // little-endian, as llama.cpp writes it
  for (int j = 0; j < kBlock / 2; j++) {
    const int lo = (qs[j] & 0xF) | (((high >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | (((high >> (j + 16)) & 1) << 4);
    u.q[j] = static_cast<int8_t>(lo - zero);
    u.q[j + 16] = static_cast<int8_t>(hi - zero);
  }
}

void unpack_q4_0(const uint8_t* blk, Unpacked& u) {
  unpack_nibbles(blk + 2, nullptr, 8, u);
  u.d = blk;
  u.m = nullptr;
}

void unpack_q4_1(const uint8_t* blk, Unpacked& u) {
  unpack_nibbles(blk + 4, nullptr, 0, u);
  u.d = blk;
  u.m = blk + 2;
}

void unpack_q5_0(const uint8_t* blk, Unpacked& u) {
  unpack_nibbles(blk + 6, blk + 2, 16, u);
  u.d = blk;
  u.m = nullptr;
}

void unpack_q5_1(const uint8_t* blk, Unpacked& u) {
  unpack_nibbles(blk + 8, blk + 4, 0, u);
  u.d = blk;
  u.m = blk + 2;
}

// Column c of a record (q8_0.h): its q in `vpdpbusd` order (operand t = k / 4, byte 4c + k % 4),
// d, the int16 sum of q, and m.
void put_column(const Unpacked& u, const Record& r, uint8_t* rec, int c) {
  int32_t sum = 0;
  for (int k = 0; k < kBlock; k++) {
    const int t = k / 4, i = 4 * c + k % 4;
    sum += u.q[k];
    if (r.bits == 8) {
      rec[kOperandBytes * t + i] = static_cast<uint8_t>(u.q[k]);
      continue;
    }
    const int stored = u.q[k] + r.zero;  // in [0, 2^bits)
    rec[kOperandBytes * (t / 2) + i] |= static_cast<uint8_t>((stored & 0xF) << (4 * (t % 2)));
    if (stored >> 4) rec[kNibbleBytes + 8 * t + i / 8] |= static_cast<uint8_t>(1 << (i % 8));
  }
  const int16_t s = static_cast<int16_t>(sum);  // |sum| <= 32 x 128
  std::memcpy(rec + r.scales + 2 * c, u.d, 2);
  std::memcpy(rec + r.sums + 2 * c, &s, 2);
  if (u.m != nullptr) std::memcpy(rec + r.mins + 2 * c, u.m, 2);
}

using Unpack = void (*)(const uint8_t*, Unpacked&);

struct Packer {
  const char* fn;    // the op's name, for errors
  const char* type;  // the gguf type name
  int file_bytes;    // per 32-block
  Record record;
  Unpack unpack;
};

at::Tensor pack(const at::Tensor& blocks, const Packer& f) {
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte && blocks.device().is_cpu() &&
                  blocks.size(1) % f.file_bytes == 0,
              f.fn, ": blocks must be a uint8 [N, K / 32 * ", f.file_bytes, "] on the CPU (a GGUF ", f.type,
              " tensor's rows), got ", blocks.sizes());
  const at::Tensor raw = blocks.contiguous();
  const int64_t n = raw.size(0), nb = raw.size(1) / f.file_bytes, groups = (n + kGroupCols - 1) / kGroupCols;
  at::Tensor packed = at::zeros({groups, nb, f.record.bytes}, raw.options());  // padded columns stay 0
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = packed.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    Unpacked u;
    for (int64_t g = begin; g < end; g++)
      for (int c = 0; c < kGroupCols && g * kGroupCols + c < n; c++)
        for (int64_t b = 0; b < nb; b++) {
          f.unpack(src + (g * kGroupCols + c) * raw.size(1) + b * f.file_bytes, u);
          put_column(u, f.record, dst + (g * nb + b) * f.record.bytes, c);
        }
  });
  return packed;
}

}  // namespace

at::Tensor pack_q8_0_linear(const at::Tensor& blocks) {
  return pack(blocks, {"pack_q8_0_linear", "Q8_0", kFileBlockBytes, record_of(Format::kQ8_0), unpack_q8_0});
}

at::Tensor pack_q4_0_linear(const at::Tensor& blocks) {
  return pack(blocks, {"pack_q4_0_linear", "Q4_0", kQ4_0FileBytes, record_of(Format::kQ4_0), unpack_q4_0});
}

at::Tensor pack_q4_1_linear(const at::Tensor& blocks) {
  return pack(blocks, {"pack_q4_1_linear", "Q4_1", kQ4_1FileBytes, record_of(Format::kQ4_1), unpack_q4_1});
}

at::Tensor pack_q5_0_linear(const at::Tensor& blocks) {
  return pack(blocks, {"pack_q5_0_linear", "Q5_0", kQ5_0FileBytes, record_of(Format::kQ5_0), unpack_q5_0});
}

at::Tensor pack_q5_1_linear(const at::Tensor& blocks) {
  return pack(blocks, {"pack_q5_1_linear", "Q5_1", kQ5_1FileBytes, record_of(Format::kQ5_1), unpack_q5_1});
}

}  // namespace rtp_llm::ops
