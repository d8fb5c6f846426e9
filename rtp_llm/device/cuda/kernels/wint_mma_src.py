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

// c += A B for one k-step: A the 16 x 16 codes of word w minus the zero pairs (zg: row g, zh: row g + 8),
// B the activations' pairs b01 (logical k 2t, 2t + 1) and b23 (2t + 8, 2t + 9).
__device__ __forceinline__ void mma_step(float c[4], u32 w, u32 zg, u32 zh, u32 b01, u32 b23) {
  const u32 a0 = sub2(biased_pair(w), zg);
  const u32 a1 = sub2(biased_pair(w >> 4), zh);
  const u32 a2 = sub2(biased_pair(w >> 8), zg);
  const u32 a3 = sub2(biased_pair(w >> 12), zh);
  asm("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPES ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
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

// Weights (one read each, not kept in L1; no kernel writes them, so they may be read before the
// PDL wait).
__device__ __forceinline__ U4 load_stream(const U4* p) {
  U4 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Activations: a predecessor's output, so a coherent load (not .nc) ordered after the PDL wait.
__device__ __forceinline__ U4 load_act(const U4* p) {
  U4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}

// PDL (kernels/nvrtc.py launches with programmatic serialization): wait until the previous kernel
// has completed and its writes are visible; a no-op where the launch had no PDL.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Lets the next kernel launch. Also a fence for the compiler: the loads issued before it stay
// before it, so the activations' loads go out together (else ptxas places each just before its mma
// and a warp waits one L2 round trip a chunk).
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// A group's zero pairs (rows g, g + 8: BIAS + zero in both halves) and scales.
struct Group { u32 zg, zh; float sg, sh; };

__device__ __forceinline__ Group load_group(const scale_t* scale, const u16* zb, long sg, long sh) {
  Group q;
  u32 h = zb[sg]; q.zg = h | (h << 16);
  h = zb[sh]; q.zh = h | (h << 16);
  q.sg = scale_f(scale[sg]);
  q.sh = scale_f(scale[sh]);
  return q;
}

__device__ __forceinline__ void add_scaled(float acc[4], float c[4], Group q) {
  acc[0] += q.sg * c[0]; acc[1] += q.sg * c[1]; acc[2] += q.sh * c[2]; acc[3] += q.sh * c[3];
  c[0] = c[1] = c[2] = c[3] = 0.f;
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
// A warp's CPW chunks hold whole groups (CPW a multiple of GC: NG of them) or lie in one group (GC a
// multiple of CPW, or one group a row).
#define WHOLE_GROUPS (GC > 0 && CPW % GC == 0)
#define NG (WHOLE_GROUPS ? CPW / GC : 1)

// out[m, n] = sum_k W[n, k] x[m, k] for m < M <= 8; GATED: W holds 2 N rows (gate then up) and
// out = silu(gate) * up, rounded as HF rounds gate_proj, act_fn and the product. Block b computes
// rows [16 b, 16 b + 16) (and the up rows N + those); its warps take runs of CPW chunks in turn
// (warp w the runs w, w + warps, ...; of a run's chunks the first `mine` exist). A run, in order:
// its words, zeros and scales (before the PDL wait: the first run's load while the previous kernel
// finishes), then all its activations at once, then the mmas, straight-line (a chunk past K has
// zero activations and adds exactly 0). A lane's x row is min(g, M - 1): rows past M compute
// output columns that are never stored. zb: BIAS + zero in the activations' type, [rows, G];
// scale [rows, G]; GC: chunks a group (0: one group a row). Every warp has a run (warps <= runs), so
// warp 0 has waited before it writes.
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
  const long rg = (long)tile * 16 + g;  // this lane's rows: rg and rg + 8 (gate rows when gated)
  const long up_rows = (long)n_tiles * 16 * G;  // gated: the up rows' offset in scale / zb
  const u16* x_row = x + (long)min(g, M - 1) * stride_x + 16 * t;
  float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
  for (int c_beg = warp * CPW; c_beg < KC; c_beg += warps * CPW) {
    const int mine = min(CPW, KC - c_beg);  // warp-uniform
    const U4* w0p = wq + ((long)tile * KC + c_beg) * 32 + lane;
    const U4* w1p = w0p + (long)n_tiles * KC * 32;
    const long sg = rg * G + (GC > 0 ? c_beg / GC : 0), sh = sg + 8 * G;
    U4 w0[CPW], w1[CPW];
    Group q0[NG], q1[NG];
#pragma unroll
    for (int i = 0; i < CPW; ++i) {
      w0[i] = w1[i] = U4{0u, 0u, 0u, 0u};
      if (i < mine) {
        w0[i] = load_stream(w0p + i * 32);
        if (GATED) w1[i] = load_stream(w1p + i * 32);
      }
    }
#pragma unroll
    for (int j = 0; j < NG; ++j) {
      q0[j] = q1[j] = Group{0u, 0u, 0.f, 0.f};
      if (j * (WHOLE_GROUPS ? GC : 1) < mine) {
        q0[j] = load_group(scale, zb, sg + j, sh + j);
        if (GATED) q1[j] = load_group(scale, zb, up_rows + sg + j, up_rows + sh + j);
      }
    }
    pdl_wait();
    U4 xa[CPW], xb[CPW];
    const U4* xp = reinterpret_cast<const U4*>(x_row + c_beg * 64);
#pragma unroll
    for (int i = 0; i < CPW; ++i) {  // unconditional (a chunk past K re-reads chunk 0), so none waits
      xa[i] = load_act(xp + (i < mine ? i : 0) * 8);
      xb[i] = load_act(xp + (i < mine ? i : 0) * 8 + 1);
    }
    pdl_launch_dependents();
    float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < CPW; ++i) {
      if (i >= mine) xa[i] = xb[i] = U4{0u, 0u, 0u, 0u};
      const int j = WHOLE_GROUPS ? i / GC : 0;
      mma_chunk(c0, w0[i], q0[j].zg, q0[j].zh, xa[i], xb[i]);
      if (GATED) mma_chunk(c1, w1[i], q1[j].zg, q1[j].zh, xa[i], xb[i]);
      if (i == CPW - 1 || (WHOLE_GROUPS && (i + 1) % GC == 0)) {  // the group's sums, scaled
        add_scaled(acc0, c0, q0[j]);
        if (GATED) add_scaled(acc1, c1, q1[j]);
      }
    }
  }
  float* own = red + (warp * 32 + lane) * 8;
#pragma unroll
  for (int r = 0; r < 4; ++r) { own[r] = acc0[r]; own[4 + r] = acc1[r]; }
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
