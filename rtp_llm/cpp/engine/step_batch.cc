#include "rtp_llm/cpp/engine/step_batch.h"

#include <cstddef>

namespace rtp_llm {

namespace {
enum class Length { S, S1, T, SB, H };

size_t capacity(Length length, const StepBatchCapacity& c) {
  const size_t s = c.streams;
  switch (length) {
    case Length::S: return s;
    case Length::S1: return s + 1;
    case Length::T: return c.tokens;
    case Length::SB: return s * c.blocks_per_stream;
    case Length::H: return c.history_tokens;
  }
  return 0;
}
}  // namespace

void StepBatch::reserve(const StepBatchCapacity& cap) {
#define RTP_LLM_RESERVE_ARRAY(type, name, length, group) name.assign(capacity(Length::length, cap), 0);
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
