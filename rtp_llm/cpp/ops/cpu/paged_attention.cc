#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "rtp_llm/cpp/ops/compute_ops.h"
#include "rtp_llm/cpp/ops/cpu/avx512.h"

namespace rtp_llm::ops {

namespace {

// The kernel is compiled for several x86 ISAs and picked at load time (GCC function
// multiversioning), so a wheel built for baseline x86-64 still runs AVX-512 where present.
#if defined(__x86_64__)
#define RTP_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define RTP_MULTIVERSION
#endif

constexpr int kMaxGroup = 16;   // query heads per KV head
constexpr int kMaxHeadDim = 256;

template <typename T>
inline __attribute__((always_inline)) void load(const T* src, float* dst, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// One (query token, KV head) item: the group of query heads sharing that KV head attends
// keys [0, pos] of its stream, read block by block through the block table, with an online
// softmax in fp32.
template <typename T>
inline __attribute__((always_inline)) void attend(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_table, int pos, int kv_head,
            int num_kv_heads, int group, int head_dim, int block_size, float scale, T* out, int64_t q_head_stride) {
  float qf[kMaxGroup][kMaxHeadDim], acc[kMaxGroup][kMaxHeadDim], kf[kMaxHeadDim], vf[kMaxHeadDim];
  alignas(64) float s[kMaxGroup][64];
  float m[kMaxGroup], l[kMaxGroup];
  for (int g = 0; g < group; ++g) {
    load(q + g * q_head_stride, qf[g], head_dim);
    for (int d = 0; d < head_dim; ++d) qf[g][d] *= scale;
    std::fill(acc[g], acc[g] + head_dim, 0.f);
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  const int64_t token_stride = int64_t{num_kv_heads} * head_dim;
  const int num_keys = pos + 1;
  for (int start = 0; start < num_keys; start += block_size) {
    const int n = std::min(block_size, num_keys - start);
    const int64_t base = int64_t{block_table[start / block_size]} * block_size * token_stride + int64_t{kv_head} * head_dim;
    // Scores: one dot product per (key, query head); each K row is converted to fp32 once
    // and shared by the query heads of the group.
    for (int j = 0; j < n; ++j) {
      load(k_cache + base + j * token_stride, kf, head_dim);
      for (int g = 0; g < group; ++g) {
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < head_dim; ++d) dot += qf[g][d] * kf[d];
        s[g][j] = dot;
      }
    }
    for (int g = 0; g < group; ++g) {
      float* sg = s[g];
      float block_max = m[g];
      for (int j = 0; j < n; ++j) block_max = std::max(block_max, sg[j]);
      const float rescale = std::exp(m[g] - block_max);
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < n; ++j) {
        sg[j] = std::exp(sg[j] - block_max);
        sum += sg[j];
      }
      l[g] = l[g] * rescale + sum;
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) acc[g][d] *= rescale;
      m[g] = block_max;
    }
    for (int j = 0; j < n; ++j) {
      load(v_cache + base + j * token_stride, vf, head_dim);
      for (int g = 0; g < group; ++g) {
        const float p = s[g][j];
        float* a = acc[g];
#pragma omp simd
        for (int d = 0; d < head_dim; ++d) a[d] += p * vf[d];
      }
    }
  }
  for (int g = 0; g < group; ++g) {
    const float inv = 1.f / l[g];
    T* o = out + g * q_head_stride;
    for (int d = 0; d < head_dim; ++d) o[d] = static_cast<T>(acc[g][d] * inv);
  }
}

struct Problem {
  const int32_t* stream_of;
  const int32_t* starts;
  const int32_t* ctx;
  const int32_t* tables;
  int64_t bt_stride, H, D;
  int kv_heads, group, block_size;
  float scale;
  int heads_per_item;  // KV heads of one work item
  int64_t items_per_token() const { return (kv_heads + heads_per_item - 1) / heads_per_item; }
};

// One work item: a query token and KV heads [kv_head, kv_head_end) (every head of their groups).
struct Item {
  int64_t offset;  // of the first group's first query head in q and out, in elements
  const int32_t* block_table;
  int pos;  // the token's position: it attends keys [0, pos]
  int kv_head, kv_head_end;
  bool alone;  // the only query token of its stream in this call (decode)
};

inline Item item_at(const Problem& p, int64_t item) {
  const int64_t t = item / p.items_per_token();
  const int kvh = static_cast<int>(item % p.items_per_token()) * p.heads_per_item;
  const int s = p.stream_of[t];
  // Causal: token t sits at position ctx - (tokens of the stream from t on).
  const int pos = p.ctx[s] - (p.starts[s + 1] - static_cast<int>(t));
  return {(t * p.H + int64_t{kvh} * p.group) * p.D, p.tables + s * p.bt_stride, pos, kvh,
          std::min(p.kv_heads, kvh + p.heads_per_item), p.starts[s + 1] - p.starts[s] == 1};
}

template <typename T>
inline __attribute__((always_inline)) void run_items(const Problem& p, const T* q, const T* k, const T* v, T* out,
                                                     int64_t begin, int64_t end) {
  for (int64_t item = begin; item < end; ++item) {
    const Item it = item_at(p, item);
    attend(q + it.offset, k, v, it.block_table, it.pos, it.kv_head, p.kv_heads, p.group, static_cast<int>(p.D),
           p.block_size, p.scale, out + it.offset, p.D);
  }
}

void run_items_avx512(const Problem& p, avx512::Dtype dtype, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, at::Tensor& out, int64_t begin, int64_t end) {
  const int64_t elem = q.element_size();
  const avx512::AttendShape shape{p.kv_heads, p.group, static_cast<int>(p.D), p.block_size, p.scale, p.D};
  auto attend_item = [&](int64_t item) {
    const Item it = item_at(p, item);
    return avx512::AttendItem{static_cast<const char*>(q.data_ptr()) + it.offset * elem,
                              static_cast<char*>(out.data_ptr()) + it.offset * elem, it.block_table, it.pos,
                              it.kv_head, it.kv_head_end, it.alone};
  };
  if (begin >= end) return;
  avx512::AttendItem cur = attend_item(begin);
  for (int64_t item = begin; item < end; ++item) {
    const bool last = item + 1 == end;
    const avx512::AttendItem next = last ? cur : attend_item(item + 1);
    avx512::attend(dtype, k.data_ptr(), v.data_ptr(), shape, cur, last ? nullptr : &next, item == begin);
    cur = next;
  }
}

RTP_MULTIVERSION void run_items_f32(const Problem& p, const float* q, const float* k, const float* v, float* out,
                                    int64_t begin, int64_t end) {
  run_items(p, q, k, v, out, begin, end);
}
RTP_MULTIVERSION void run_items_bf16(const Problem& p, const at::BFloat16* q, const at::BFloat16* k,
                                     const at::BFloat16* v, at::BFloat16* out, int64_t begin, int64_t end) {
  run_items(p, q, k, v, out, begin, end);
}
RTP_MULTIVERSION void run_items_f16(const Problem& p, const at::Half* q, const at::Half* k, const at::Half* v,
                                    at::Half* out, int64_t begin, int64_t end) {
  run_items(p, q, k, v, out, begin, end);
}

}  // namespace

bool paged_attention_vectorized(int64_t head_dim, int64_t group, int64_t block_size) {
  return avx512::supported() &&
         avx512::attention_supports(static_cast<int>(head_dim), static_cast<int>(group), static_cast<int>(block_size));
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& query_starts,
                           const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3, "paged_attention: q must be [T, H, D], got ", q.sizes());
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_attention: k/v caches must be [blocks, block_size, kv_heads, D]");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "paged_attention: q and the caches must share a dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && query_starts.scalar_type() == at::kInt &&
                  context_lens.scalar_type() == at::kInt,
              "paged_attention: block_tables, query_starts and context_lens must be int32");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_attention: caches must be contiguous");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int block_size = static_cast<int>(k_cache.size(1));
  const int kv_heads = static_cast<int>(k_cache.size(2));
  TORCH_CHECK(k_cache.size(3) == D && D <= kMaxHeadDim, "paged_attention: head_dim mismatch or > ", kMaxHeadDim);
  TORCH_CHECK(H % kv_heads == 0 && H / kv_heads <= kMaxGroup, "paged_attention: ", H, " heads over ", kv_heads,
              " KV heads is not supported");
  TORCH_CHECK(block_size <= 64, "paged_attention: block_size must be <= 64");
  const int group = static_cast<int>(H / kv_heads);
  const int64_t S = context_lens.size(0);
  TORCH_CHECK(query_starts.size(0) == S + 1 && block_tables.size(0) == S, "paged_attention: batch shape mismatch");

  const at::Tensor qc = q.contiguous();
  const at::Tensor bt = block_tables.contiguous(), qs = query_starts.contiguous(), cl = context_lens.contiguous();
  at::Tensor out = at::empty_like(qc);
  const int32_t* starts = qs.data_ptr<int32_t>();
  const int32_t* ctx = cl.data_ptr<int32_t>();
  TORCH_CHECK(starts[S] == T, "paged_attention: query_starts[-1] must equal the number of tokens");
  // token -> stream, so that work items are (token, KV head) pairs in one flat range.
  std::vector<int32_t> stream_of(T);
  for (int64_t s = 0; s < S; ++s) std::fill(stream_of.begin() + starts[s], stream_of.begin() + starts[s + 1], s);

  Problem problem{stream_of.data(), starts, ctx, bt.data_ptr<int32_t>(), bt.size(1), H, D,
                  kv_heads, group, block_size, static_cast<float>(scale), 1};
  if (const auto dtype = avx512::usable_for(qc.scalar_type());
      dtype && avx512::attention_supports(static_cast<int>(D), group, block_size)) {
    // Whole token rows (every KV head) per item where the tokens alone keep the threads busy:
    // a block's rows are then read whole, not as one head's slice of each (faster over a
    // cache larger than the caches); single KV heads for fewer tokens (batch-1 decode), so
    // that they split.
    if (T >= 2 * at::get_num_threads()) problem.heads_per_item = std::max(1, avx512::kMaxItemHeads / group);
    const int64_t items = T * problem.items_per_token();
    at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
      run_items_avx512(problem, *dtype, qc, k_cache, v_cache, out, b, e);
    });
    return out;
  }
  const int64_t items = T * kv_heads;
  switch (qc.scalar_type()) {
    case at::kFloat:
      at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
        run_items_f32(problem, qc.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                      out.data_ptr<float>(), b, e);
      });
      break;
    case at::kBFloat16:
      at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
        run_items_bf16(problem, qc.data_ptr<at::BFloat16>(), k_cache.data_ptr<at::BFloat16>(),
                       v_cache.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), b, e);
      });
      break;
    case at::kHalf:
      at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
        run_items_f16(problem, qc.data_ptr<at::Half>(), k_cache.data_ptr<at::Half>(), v_cache.data_ptr<at::Half>(),
                      out.data_ptr<at::Half>(), b, e);
      });
      break;
    default:
      TORCH_CHECK(false, "paged_attention: unsupported dtype ", qc.scalar_type());
  }
  return out;
}

}  // namespace rtp_llm::ops
