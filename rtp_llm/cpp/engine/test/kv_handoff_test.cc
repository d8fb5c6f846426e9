// Prefill/decode disaggregation through two engines: a PREFILL engine runs the prompt and the
// first token and keeps the prompt's blocks (export); a DECODE engine imports them into its
// prefix cache (the fake models' "KV" copied block by block, as the transfer engine would) and
// continues after the first token. The fake model reads its context through the block tables,
// so the decode side's tokens equal the reference only when the imported blocks hold the right
// KV and every id lines up.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "rtp_llm/cpp/engine/engine_core.h"
#include "rtp_llm/cpp/engine/test/engine_core_test_util.h"
#include "rtp_llm/cpp/engine/test/fake_model.h"

namespace rtp_llm {
namespace {

using namespace testing;  // NOLINT: FakeModel and the shared helpers

struct Instance {
  explicit Instance(EngineCoreConfig c = SmallConfig()) : engine(c), model(c.num_blocks, c.block_size) {}
  EngineCore engine;
  FakeModel model;
  void run() {
    while (Step(engine, model)) {
    }
  }
};

GenerateConfig PrefillOnly() {
  GenerateConfig g = MaxNew(8);
  g.can_use_pd_separation = true;
  return g;
}

// The prefill side's final update for `prompt`.
StreamUpdate Prefill(Instance& p, const std::vector<int32_t>& prompt, int64_t* id) {
  EXPECT_TRUE(p.engine.enqueue(prompt, PrefillOnly(), id).ok());
  p.run();
  StreamUpdate u;
  EXPECT_TRUE(p.engine.poll(*id, 0, &u));
  return u;
}

// The request on the decode instance `d`: its prompt, the prefill's first token and export.
int64_t Handover(Instance& d, const std::vector<int32_t>& prompt, const StreamUpdate& u, int max_new) {
  KvHandover h{{u.new_tokens[0]}, u.kv_export_blocks, u.block_size, "source"};
  int64_t id = 0;
  EXPECT_TRUE(d.engine.enqueue(prompt, MaxNew(max_new), &id, 0, &h).ok());
  return id;
}

// The engine process's read of one stream's blocks: the fake models' "KV" copied block by block
// (block `corrupt_at` of the job from the wrong place when >= 0). Returns the job.
KvImportJob Read(Instance& d, const Instance& p, int corrupt_at = -1) {
  KvImportJob job;
  EXPECT_TRUE(d.engine.next_kv_import(0, &job));
  EXPECT_EQ(job.source, "source");
  for (size_t i = 0; i < job.local.size(); ++i) {
    const int from = static_cast<int>(i) == corrupt_at ? job.remote[(i + 1) % job.remote.size()] : job.remote[i];
    d.model.copy_block(p.model, from, job.local[i]);
  }
  d.engine.kv_import_done(job.stream_id, true);
  return job;
}

TEST(KvHandoff, DecodeContinuesExactlyAfterThePrefillsFirstToken) {
  Instance p, d;
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};  // 2 full blocks of 4, and 2 tokens
  int64_t pid;
  const StreamUpdate u = Prefill(p, prompt, &pid);
  ASSERT_EQ(u.status, StreamStatus::FINISHED);
  EXPECT_EQ(u.finish_reason, "");  // handed off
  ASSERT_TRUE(u.kv_exported);
  EXPECT_EQ(u.kv_export_id, pid);
  ASSERT_EQ(u.kv_export_blocks.size(), 2u);
  EXPECT_EQ(p.engine.stats().kv_exports, 1);
  EXPECT_EQ(p.engine.stats().kv_transfer.exported_blocks, 2);
  EXPECT_GT(p.engine.stats().kv.used_blocks, 0);  // held for the decode instance

  const int64_t did = Handover(d, prompt, u, 6);
  EXPECT_FALSE(Step(d.engine, d.model));  // nothing runs before its blocks are read
  const KvImportJob job = Read(d, p);
  EXPECT_EQ(job.stream_id, did);
  EXPECT_EQ(job.remote, u.kv_export_blocks);
  p.engine.release_export(pid);
  p.engine.release(pid);
  ExpectAllBlocksBack(p.engine);
  d.run();
  StreamUpdate out;
  ASSERT_TRUE(d.engine.poll(did, 0, &out));
  EXPECT_EQ(out.status, StreamStatus::FINISHED);
  EXPECT_EQ(out.num_generated, 6);
  const std::vector<int32_t> ref = d.model.reference(prompt, 6);
  EXPECT_EQ(u.new_tokens[0], ref[0]);
  EXPECT_EQ(out.new_tokens, std::vector<int32_t>(ref.begin() + 1, ref.end()));  // the first is not sent again
  EXPECT_EQ(d.engine.stats().kv.hit_tokens, 8);  // both imported blocks were used, not recomputed
  EXPECT_EQ(d.engine.stats().kv_transfer.imported_blocks, 2);
  EXPECT_EQ(d.engine.stats().kv_transfer.read_seconds.counts[0], 1);  // (this reader reports 0 s, 0 bytes)
  EXPECT_EQ(d.engine.stats().kv_transfer.read_bytes.counts[0], 1);
  d.engine.release(did);
  ExpectAllBlocksBack(d.engine);
}

TEST(KvHandoff, TheDecodeSideReadsTheImportedBlocks) {
  // A block copied from the wrong place changes the output: the imported KV is what runs.
  Instance p, d;
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  int64_t pid;
  const StreamUpdate u = Prefill(p, prompt, &pid);
  const int64_t did = Handover(d, prompt, u, 4);
  Read(d, p, /*corrupt_at=*/0);
  d.run();
  const std::vector<int32_t> ref = d.model.reference(prompt, 4);
  EXPECT_NE(Generated(d.engine, did), std::vector<int32_t>(ref.begin() + 1, ref.end()));
}

TEST(KvHandoff, AFirstTokenThatEndsTheRequestExportsNothingAndReleaseMayComeFirst) {
  Instance p;
  int64_t id;
  GenerateConfig g = PrefillOnly();
  g.stop_words_list = {{FakeModel::next_token(std::vector<int32_t>{1, 2, 3, 4, 5}.data(), 5, 1000)}};
  ASSERT_TRUE(p.engine.enqueue({1, 2, 3, 4, 5}, g, &id).ok());
  p.run();
  StreamUpdate u;
  ASSERT_TRUE(p.engine.poll(id, 0, &u));
  EXPECT_EQ(u.finish_reason, "stop");
  EXPECT_FALSE(u.kv_exported);
  EXPECT_EQ(p.engine.stats().kv_exports, 0);
  p.engine.release(id);
  ExpectAllBlocksBack(p.engine);

  GenerateConfig one = PrefillOnly();
  one.max_new_tokens = 1;  // the first token is the last: "length", nothing kept
  ASSERT_TRUE(p.engine.enqueue({1, 2, 3, 4, 5, 6, 7, 8, 9}, one, &id).ok());
  p.run();
  ASSERT_TRUE(p.engine.poll(id, 0, &u));
  EXPECT_EQ(u.finish_reason, "length");
  EXPECT_FALSE(u.kv_exported);
  p.engine.release(id);
  ExpectAllBlocksBack(p.engine);

  // RemoteFinish before the stream's blocks were adopted (its last step still in flight).
  ASSERT_TRUE(p.engine.enqueue({1, 2, 3, 4, 5, 6}, PrefillOnly(), &id).ok());
  p.engine.release_export(id);
  p.run();
  EXPECT_EQ(p.engine.stats().kv_exports, 0);
  p.engine.release(id);
  ExpectAllBlocksBack(p.engine);
}

TEST(KvHandoff, AnUnreadExportIsFreedAtItsTimeout) {
  EngineCoreConfig c = SmallConfig();
  c.kv_export_timeout_ms = 1;
  Instance p(c);
  int64_t id;
  Prefill(p, {1, 2, 3, 4, 5, 6, 7, 8, 9}, &id);
  EXPECT_EQ(p.engine.stats().kv_exports, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  p.engine.schedule();  // expiry runs with scheduling
  EXPECT_EQ(p.engine.stats().kv_exports, 0);
  EXPECT_EQ(p.engine.stats().kv_exports_expired, 1);
  p.engine.release(id);
  ExpectAllBlocksBack(p.engine);
}

TEST(KvHandoff, AFailedReadIsRecomputedAndCachedBlocksAreNotReadAgain) {
  Instance p, d;
  const std::vector<int32_t> prompt = {21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33};  // 3 full blocks
  int64_t pid;
  const StreamUpdate u = Prefill(p, prompt, &pid);
  const std::vector<int32_t> ref = d.model.reference(prompt, 3);

  const int64_t failed = Handover(d, prompt, u, 3);
  KvImportJob job;
  ASSERT_TRUE(d.engine.next_kv_import(0, &job));
  EXPECT_EQ(job.local.size(), 3u);
  d.engine.kv_import_done(job.stream_id, false);  // the transfer failed: nothing published, all recomputed
  d.run();
  EXPECT_EQ(Generated(d.engine, failed), std::vector<int32_t>(ref.begin() + 1, ref.end()));
  EXPECT_EQ(d.engine.stats().kv.hit_tokens, 0);
  d.engine.release(failed);

  // Now this instance has the prompt's blocks cached: a second hand-over reads none of them.
  const int64_t again = Handover(d, prompt, u, 3);
  ASSERT_TRUE(d.engine.next_kv_import(0, &job));
  EXPECT_EQ(job.stream_id, again);
  EXPECT_TRUE(job.local.empty());
  d.engine.kv_import_done(job.stream_id, true);
  d.run();
  EXPECT_EQ(Generated(d.engine, again), std::vector<int32_t>(ref.begin() + 1, ref.end()));
  EXPECT_EQ(d.engine.stats().kv.hit_tokens, 12);
  EXPECT_EQ(d.engine.stats().kv_transfer.imported_blocks, 0);  // (the failed read counts none either)
  EXPECT_EQ(d.engine.stats().kv_transfer.failures, 1);
  const auto& seconds = d.engine.stats().kv_transfer.read_seconds.counts;  // the failed read is in no bucket
  EXPECT_EQ(std::accumulate(seconds.begin(), seconds.end(), int64_t{0}),
            d.engine.stats().kv_transfer.imports - d.engine.stats().kv_transfer.failures);
  d.engine.release(again);
  ExpectAllBlocksBack(d.engine);
}

TEST(KvHandoff, AStreamCancelledBeforeItsReadIsSkippedAndMismatchedBlocksAreRefused) {
  Instance p, d;
  int64_t pid;
  const StreamUpdate u = Prefill(p, {1, 2, 3, 4, 5, 6, 7, 8, 9}, &pid);
  const int64_t id = Handover(d, {1, 2, 3, 4, 5, 6, 7, 8, 9}, u, 3);
  EXPECT_TRUE(d.engine.abort(id));
  KvImportJob job;
  EXPECT_FALSE(d.engine.next_kv_import(0, &job));
  d.engine.release(id);
  ExpectAllBlocksBack(d.engine);

  KvHandover h{{u.new_tokens[0]}, u.kv_export_blocks, u.block_size * 2, "source"};
  int64_t other;
  EXPECT_EQ(d.engine.enqueue({1, 2, 3, 4, 5, 6, 7, 8, 9}, MaxNew(3), &other, 0, &h).field, "kv_export");
}

TEST(KvHandoff, ResumedTokensThatFinishTheRequestAreRefusedByName) {
  Instance d;
  int64_t id;
  KvHandover one{{7}, {}, 4, ""};
  const ErrorInfo e = d.engine.enqueue({1, 2, 3}, MaxNew(1), &id, 0, &one);
  EXPECT_EQ(e.code, ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(e.field, "generated_token_ids");
  KvHandover bad{{-4}, {}, 4, ""};
  EXPECT_EQ(d.engine.enqueue({1, 2, 3}, MaxNew(2), &id, 0, &bad).field, "generated_token_ids");
  ExpectAllBlocksBack(d.engine);
}

TEST(KvHandoff, ReadHistogramsCountAsPrometheusLe) {
  // A value on a bound counts in that bound's bucket; past the last, in +Inf.
  BucketCounts<kKvReadSecondsBounds.size()> h;
  h.observe(kKvReadSecondsBounds, 0.0);
  h.observe(kKvReadSecondsBounds, 0.001);   // == the second bound
  h.observe(kKvReadSecondsBounds, 0.0011);  // just above it
  h.observe(kKvReadSecondsBounds, 30.0);
  std::array<int64_t, kKvReadSecondsBounds.size() + 1> want{};
  want[0] = 1, want[1] = 1, want[2] = 1, want[kKvReadSecondsBounds.size()] = 1;
  EXPECT_EQ(h.counts, want);
  EXPECT_TRUE(std::is_sorted(kKvReadSecondsBounds.begin(), kKvReadSecondsBounds.end()));
  EXPECT_TRUE(std::is_sorted(kKvReadBytesBounds.begin(), kKvReadBytesBounds.end()));
}

}  // namespace
}  // namespace rtp_llm
