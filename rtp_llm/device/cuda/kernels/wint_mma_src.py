"""The CUDA source of the int4 tensor-core kernels (wint_mma.py compiles it with NVRTC; the layout
they read is described there): wint4_gemv (M <= 8 activation rows against a packed int4 weight, one
mma.sync m16n8k16 per 16 x 16 codes) and wint4_dequant (the packed weight widened to the activations'
dtype for larger batches). Defines: ACT_F16 (fp16 activations; bf16 otherwise), SCALE_F16 / SCALE_F32
(the scales' dtype; bf16 otherwise), GATED, CPW (chunks of 64 inputs a warp), GC (chunks a group; 0:
one group a row), LB (threads a block at most).

A code becomes an operand without a conversion: OR-ed into the mantissa of the activations' type at
BIAS (bf16 128, fp16 1024: one ulp there is 1) it reads BIAS + q, and subtracting the group's BIAS +
zero (exact: small integers) leaves q - zero exactly; the tensor core multiplies those by the
activations exactly and adds in fp32; each group's sums are scaled once (the Triton GEMV's math)."""

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned short u16;
struct __align__(16) U4 { u32 x, y, z, w; };
struct __align__(8) U2 { u32 x, y; };

#ifdef ACT_F16
#define MAGIC 0x64006400u  // fp16 1024.0 in both halves: MAGIC | q (q < 16 in each half) = 1024 + q exactly
#define BIAS 1024.0f
#define MMA_TYPES "f16.f16"
#define SUB2 "sub.f16x2"
#else
#define MAGIC 0x43004300u  // bf16 128.0 in both halves: MAGIC | q = 128 + q exactly
#define BIAS 128.0f
#define MMA_TYPES "bf16.bf16"
#define SUB2 "sub.bf16x2"
#endif

#if defined(SCALE_F32)
typedef float scale_t;
__device__ __forceinline__ float scale_f(scale_t s) { return s; }
#elif defined(SCALE_F16)
typedef u16 scale_t;
__device__ __forceinline__ float scale_f(scale_t s) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
  return f;
}
#else
typedef u16 scale_t;
__device__ __forceinline__ float scale_f(scale_t s) { return __uint_as_float(((u32)s) << 16); }
#endif

__device__ __forceinline__ float act_f(u16 h) {
#ifdef ACT_F16
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#else
  return __uint_as_float(((u32)h) << 16);
#endif
}

__device__ __forceinline__ u16 act_from_f(float f) {
  u16 h;
#ifdef ACT_F16
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
#else
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
#endif
  return h;
}

// Two codes (bits 0-3 and 16-19 of w) as the activation type's pair (BIAS + q), one LOP3.
__device__ __forceinline__ u32 biased_pair(u32 w) {
  u32 r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "n"(0x000F000F), "n"(MAGIC));
  return r;
}

__device__ __forceinline__ u32 sub2(u32 a, u32 b) {
  u32 r;
  asm(SUB2 " %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

__device__ __forceinline__ U4 load_stream(const U4* p) {  // weights: read once, not kept in L1
  U4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ U4 load_x(const u16* p) {
  U4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// c += A B for one k-step: A the 16 x 16 codes of word w minus the zero pairs (zg: row g, zh: row g + 8),
// B the activations' pairs b01 (logical k 2t, 2t + 1) and b23 (2t + 8, 2t + 9).
__device__ __forceinline__ void mma_step(float c[4], u32 w, u32 zg, u32 zh, u32 b01, u32 b23) {
  const u32 a0 = sub2(biased_pair(w), zg);
  const u32 a1 = sub2(biased_pair(w >> 4), zh);
  const u32 a2 = sub2(biased_pair(w >> 8), zg);
  const u32 a3 = sub2(biased_pair(w >> 12), zh);
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPES ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b01), "r"(b23));
}

// One 64-input chunk (4 k-steps) of a tile: w the lane's 4 words, xa / xb its 16 activations.
__device__ __forceinline__ void mma_chunk(float c[4], U4 w, u32 zg, u32 zh, U4 xa, U4 xb) {
  mma_step(c, w.x, zg, zh, xa.x, xa.y);
  mma_step(c, w.y, zg, zh, xa.z, xa.w);
  mma_step(c, w.z, zg, zh, xb.x, xb.y);
  mma_step(c, w.w, zg, zh, xb.z, xb.w);
}

#ifndef GATED
#define GATED 0
#endif
#ifndef CPW
#define CPW 8
#endif
#ifndef GC
#define GC 2
#endif

// out[m, n] = sum_k W[n, k] x[m, k] for m < M <= 8; GATED: W holds 2 N rows (gate then up) and
// out = silu(gate) * up, rounded as HF rounds gate_proj, act_fn and the product. Block b computes
// rows [16 b, 16 b + 16) (and the up rows N + those); warp w takes chunks [w CPW, (w + 1) CPW), all
// its words loaded before any is used. GC: chunks a group (CPW a multiple of it), 0: one group a row.
// zb: BIAS + zero in the activations' type, [rows, G]; scale [rows, G].
#ifndef LB
#define LB 512
#endif
extern "C" __global__ void __launch_bounds__(LB) wint4_gemv(
    const u16* __restrict__ x, int stride_x, int M, const U4* __restrict__ wq, const scale_t* __restrict__ scale,
    const u16* __restrict__ zb, int G, u16* __restrict__ out, int stride_out, int n_tiles, int KC) {
  extern __shared__ float red[];  // [warps][32 lanes][8]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x;
  const int c_beg = warp * CPW;
  const long rg = (long)tile * 16 + g;  // this lane's rows: rg and rg + 8 (gate rows when gated)
  const long up_rows = (long)n_tiles * 16 * G;  // gated: the up rows' offset in scale / zb
  const U4* w0p = wq + ((long)tile * KC + c_beg) * 32 + lane;
  const U4* w1p = w0p + (long)n_tiles * KC * 32;
  const u16* xp = x + (long)g * stride_x + 16 * t + c_beg * 64;
  const bool has_x = g < M;
  const long sg = rg * G, sh = sg + 8 * G;
  U4 w0[CPW], w1[CPW];
#pragma unroll
  for (int i = 0; i < CPW; ++i) {
    if (c_beg + i < KC) {
      w0[i] = load_stream(w0p + i * 32);
      if (GATED) w1[i] = load_stream(w1p + i * 32);
    }
  }
  float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
  float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
  u32 z0g = 0, z0h = 0, z1g = 0, z1h = 0;
  float s0g = 0.f, s0h = 0.f, s1g = 0.f, s1h = 0.f;
#pragma unroll
  for (int i = 0; i < CPW; ++i) {
    if (c_beg + i < KC) {
      if (i == 0 || (GC > 0 && i % GC == 0)) {  // a new group: its zero pairs and scales
        const long gi = GC > 0 ? (c_beg + i) / GC : 0;
        u32 h;
        h = zb[sg + gi]; z0g = h | (h << 16);
        h = zb[sh + gi]; z0h = h | (h << 16);
        s0g = scale_f(scale[sg + gi]);
        s0h = scale_f(scale[sh + gi]);
        if (GATED) {
          h = zb[up_rows + sg + gi]; z1g = h | (h << 16);
          h = zb[up_rows + sh + gi]; z1h = h | (h << 16);
          s1g = scale_f(scale[up_rows + sg + gi]);
          s1h = scale_f(scale[up_rows + sh + gi]);
        }
      }
      U4 xa = {0u, 0u, 0u, 0u}, xb = {0u, 0u, 0u, 0u};
      if (has_x) {
        xa = load_x(xp + i * 64);
        xb = load_x(xp + i * 64 + 8);
      }
      mma_chunk(c0, w0[i], z0g, z0h, xa, xb);
      if (GATED) mma_chunk(c1, w1[i], z1g, z1h, xa, xb);
    }
    const bool group_ends = i == CPW - 1 || (GC > 0 && (i + 1) % GC == 0);
    if (group_ends) {  // the group's sums, scaled (c is 0 past KC)
      acc0[0] += s0g * c0[0]; acc0[1] += s0g * c0[1]; acc0[2] += s0h * c0[2]; acc0[3] += s0h * c0[3];
      if (GATED) {
        acc1[0] += s1g * c1[0]; acc1[1] += s1g * c1[1]; acc1[2] += s1h * c1[2]; acc1[3] += s1h * c1[3];
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) { c0[r] = 0.f; c1[r] = 0.f; }
    }
  }
  float* mine = red + (warp * 32 + lane) * 8;
#pragma unroll
  for (int r = 0; r < 4; ++r) { mine[r] = acc0[r]; mine[4 + r] = acc1[r]; }
  __syncthreads();
  if (warp != 0) return;
  float tot[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int v = 0; v < warps; ++v) {  // in warp order: the sums do not depend on timing
    const float* p = red + (v * 32 + lane) * 8;
#pragma unroll
    for (int r = 0; r < 8; ++r) tot[r] += p[r];
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int m = 2 * t + (r & 1);
    if (m >= M) continue;
    const long row = r < 2 ? rg : rg + 8;
    float v = tot[r];
    if (GATED) {
      const float gv = act_f(act_from_f(v));
      float e;  // exp(-gv), as Triton's sigmoid takes it
      asm("ex2.approx.f32 %0, %1;" : "=f"(e) : "f"(-gv * 1.4426950408889634f));
      const float a = act_f(act_from_f(gv / (1.f + e)));
      v = a * act_f(act_from_f(tot[4 + r]));
    }
    out[(long)m * stride_out + row] = act_from_f(v);
  }
}

// W in the activations' type, [N, K] row-major, from the packed words: one thread a word (the 8 codes
// of one lane's k-step: 4 consecutive inputs of row g, 4 of row g + 8), (q - zero) * scale rounded once.
extern "C" __global__ void wint4_dequant(const U4* __restrict__ wq, const scale_t* __restrict__ scale,
                                         const u16* __restrict__ zb, int G, int gc, u16* __restrict__ out,
                                         int K, int KC, int words) {
  const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= words) return;
  const int j = i & 3, lane = (i >> 2) & 31;
  const long chunk = i >> 7;  // (tile, c)
  const long tile = chunk / KC;
  const int c = chunk % KC;
  const int g = lane >> 2, t = lane & 3;
  const u32 w = reinterpret_cast<const u32*>(wq)[i];
  const int k = c * 64 + 16 * t + 4 * j;
  const long gi = gc > 0 ? c / gc : 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // row g: nibbles 0, 4, 2, 6; row g + 8: 1, 5, 3, 7
    const long row = tile * 16 + g + 8 * half;
    const float s = scale_f(scale[row * G + gi]);
    const float z = act_f(zb[row * G + gi]) - BIAS;
    const int nib[4] = {half, 4 + half, 2 + half, 6 + half};
    u16 v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = act_from_f(((float)((w >> (4 * nib[e])) & 15) - z) * s);
    U2 pair;
    pair.x = v[0] | ((u32)v[1] << 16);
    pair.y = v[2] | ((u32)v[3] << 16);
    *reinterpret_cast<U2*>(out + row * K + k) = pair;
  }
}
"""
