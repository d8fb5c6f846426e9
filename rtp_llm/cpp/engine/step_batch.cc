#include "rtp_llm/cpp/engine/step_batch.h"

#include <cstddef>

namespace rtp_llm {

void StepBatch::reserve(int max_streams, int max_tokens, int max_blocks_per_stream) {
  const size_t s = max_streams, t = max_tokens;
  for (auto* v : {&query_lens, &prefix_lens, &context_lens, &do_sample, &top_k, &num_generated, &return_logprobs}) {
    v->assign(s, 0);
  }
  query_starts.assign(s + 1, 0);
  stream_ids.assign(s, 0);
  random_seed.assign(s, -1);
  for (auto* v : {&temperature, &top_p, &min_p, &repetition_penalty, &presence_penalty, &frequency_penalty}) {
    v->assign(s, 0.0f);
  }
  block_tables.assign(s * max_blocks_per_stream, 0);
  token_ids.assign(t, 0);
  positions.assign(t, 0);
  slot_mapping.assign(t, 0);
}

}  // namespace rtp_llm
