#include "rtp_llm/cpp/engine/step_batch.h"

#include <cstddef>

namespace rtp_llm {

size_t array_capacity(ArrayLength length, const StepBatchCapacity& c) {
  const size_t s = c.streams;
  switch (length) {
    case ArrayLength::S: return s;
    case ArrayLength::S1: return s + 1;
    case ArrayLength::T: return c.tokens;
    case ArrayLength::SB: return s * c.blocks_per_stream;
    case ArrayLength::H: return c.history_tokens;
    case ArrayLength::L: return c.bias_entries;
  }
  return 0;
}

void StepBatch::reserve(const StepBatchCapacity& cap) {
#define RTP_LLM_RESERVE_ARRAY(type, name, length, group) name.assign(array_capacity(ArrayLength::length, cap), 0);
#define RTP_LLM_RESERVE_PARAM(type, name, def, ...) name.assign(cap.streams, def);
  RTP_LLM_STEP_ARRAYS(RTP_LLM_RESERVE_ARRAY)
  RTP_LLM_ALL_SAMPLING(RTP_LLM_RESERVE_PARAM)
#undef RTP_LLM_RESERVE_ARRAY
#undef RTP_LLM_RESERVE_PARAM
}

void StepBatch::clear() {
#define RTP_LLM_CLEAR_COUNT(name) name = 0;
  RTP_LLM_STEP_COUNTS(RTP_LLM_CLEAR_COUNT)
#undef RTP_LLM_CLEAR_COUNT
}

}  // namespace rtp_llm
