// Shared by the EngineCore tests: a small engine, one-step driving with the fake model, and
// checks that every block came back.
#pragma once

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "rtp_llm/cpp/engine/engine_core.h"
#include "rtp_llm/cpp/engine/test/fake_model.h"

namespace rtp_llm::testing {

inline EngineCoreConfig SmallConfig() {
  EngineCoreConfig c;
  c.num_blocks = 24;
  c.block_size = 4;
  c.max_batch_size = 8;
  c.max_num_batched_tokens = 16;
  c.max_seq_len = 64;
  return c;
}

inline GenerateConfig MaxNew(int n) {
  GenerateConfig g;
  g.max_new_tokens = n;
  return g;
}

// Runs one step with the fake model; returns false when there was nothing to run.
inline bool Step(EngineCore& engine, FakeModel& model) {
  const StepBatch& b = engine.schedule();
  if (b.num_streams == 0) return false;
  auto tokens = model.run(b);
  EXPECT_TRUE(engine.commit(tokens.data(), nullptr, static_cast<int>(tokens.size())).ok());
  return true;
}

inline void ExpectAllBlocksBack(EngineCore& engine) {
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.kv.used_blocks, 0);
  EXPECT_EQ(s.kv.free_blocks + s.kv.cached_blocks, s.kv.total_blocks);
  EXPECT_EQ(s.running + s.waiting, 0);
}

inline std::vector<int32_t> Generated(EngineCore& engine, int64_t id) {
  StreamUpdate u;
  EXPECT_TRUE(engine.poll(id, 0, &u));
  return u.new_tokens;
}

// A stream that would run to max_seq_len (64) but times out after 20 ms.
inline int64_t EnqueueTimingOut(EngineCore& engine) {
  GenerateConfig g = MaxNew(1000);
  g.timeout_ms = 20;
  g.ignore_eos = true;
  int64_t id = 0;
  EXPECT_TRUE(engine.enqueue({1, 2, 3}, g, &id).ok());
  return id;
}

}  // namespace rtp_llm::testing
