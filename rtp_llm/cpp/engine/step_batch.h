// What the model runner executes in one step: flat arrays owned by the core, preallocated
// to their maximum sizes once (pointers stay valid for the engine's lifetime; contents are
// valid until the next schedule()). Fields, lengths and meanings: step_batch_fields.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "rtp_llm/cpp/engine/step_batch_fields.h"

namespace rtp_llm {

// The largest batch: S streams, T tokens, B blocks per stream, H history tokens, L logit-bias entries.
struct StepBatchCapacity {
  int streams, tokens, blocks_per_stream, history_tokens, bias_entries;
};

// The array length kinds of step_batch_fields.h, and the size each is preallocated to.
enum class ArrayLength { S, S1, T, SB, H, L };
size_t array_capacity(ArrayLength length, const StepBatchCapacity& cap);

struct StepBatch {
#define RTP_LLM_BATCH_COUNT(name) int name = 0;
#define RTP_LLM_BATCH_ARRAY(type, name, ...) std::vector<RTP_LLM_CTYPE(type)> name;
  RTP_LLM_STEP_COUNTS(RTP_LLM_BATCH_COUNT)
  RTP_LLM_STEP_ARRAYS(RTP_LLM_BATCH_ARRAY)
  RTP_LLM_ALL_SAMPLING(RTP_LLM_BATCH_ARRAY)  // [S], see GenerateConfig
#undef RTP_LLM_BATCH_COUNT
#undef RTP_LLM_BATCH_ARRAY

  void reserve(const StepBatchCapacity& cap);
  void clear();
};

}  // namespace rtp_llm
