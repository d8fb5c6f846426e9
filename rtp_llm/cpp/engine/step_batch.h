// What the model runner executes in one step: flat arrays owned by the core, preallocated
// to their maximum sizes once (pointers stay valid for the engine's lifetime; contents are
// valid until the next schedule()). S = num_streams, T = num_tokens, B = block_table_stride.
#pragma once

#include <cstdint>
#include <vector>

namespace rtp_llm {

struct StepBatch {
  int num_streams = 0;         // S
  int num_tokens = 0;          // T = sum(query_lens)
  int num_sampled = 0;         // streams with do_sample = 1; commit() takes that many tokens
  int block_table_stride = 0;  // B = max blocks of any stream in this step
  int num_prefill = 0;         // streams that run prompt tokens (not a single decode token)

  std::vector<int64_t> stream_ids;     // [S]
  std::vector<int32_t> query_lens;     // [S] tokens run this step
  std::vector<int32_t> prefix_lens;    // [S] positions already in the KV cache before this step
  std::vector<int32_t> context_lens;   // [S] prefix_lens + query_lens (KV length after the step)
  std::vector<int32_t> query_starts;   // [S + 1] exclusive prefix sum of query_lens
  std::vector<int32_t> do_sample;      // [S] 1 when this step ends the stream's known tokens
  std::vector<int32_t> block_tables;   // [S, B] block ids, rows padded with 0
  std::vector<int32_t> token_ids;      // [T]
  std::vector<int32_t> positions;      // [T]
  std::vector<int64_t> slot_mapping;   // [T] block_id * block_size + offset of each token's KV

  // Sampling parameters, [S] (see GenerateConfig).
  std::vector<float> temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
  std::vector<int32_t> top_k;
  std::vector<int64_t> random_seed;    // -1: none
  std::vector<int32_t> num_generated;  // tokens generated so far: a seeded sample's position
  std::vector<int32_t> return_logprobs;

  void reserve(int max_streams, int max_tokens, int max_blocks_per_stream);
  void clear() { num_streams = num_tokens = num_sampled = block_table_stride = num_prefill = 0; }
};

}  // namespace rtp_llm
