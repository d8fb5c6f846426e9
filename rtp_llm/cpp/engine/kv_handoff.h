// Prefill/decode disaggregation, the block bookkeeping of both sides. Integers only: the KV data
// moves through the transfer engine (rtp_llm/pd/), addressed by these block ids.
//
// PREFILL side, exports: the block table of a finished can_use_pd_separation stream, kept for a
// decode instance to read, until release() (RemoteFinish) or its deadline.
// DECODE side, imports: a request arrives with its first token and where its prompt's blocks are
// (KvHandover); its stream waits unadmitted while fresh blocks are reserved for the prompt's full
// blocks that are not cached here (begin_import), filled by the transfer, then published to the
// prefix cache (end_import), where the stream finds them when it is admitted (as a prefix-cache
// hit; a block evicted meanwhile, or one the transfer failed to read, is recomputed, never read
// stale).
//
// Invariant: every table held here is referenced by nothing else (no stream, no step in flight),
// so its blocks keep their contents until this class frees them. Not thread-safe: the
// EngineCore's mutex guards it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "rtp_llm/cpp/cache/kv_cache_manager.h"

namespace rtp_llm {

// What a PREFILL instance hands a DECODE instance with a request: the tokens it generated, and
// its export (KvExportPB): the prompt's full blocks there, and the transfer engine's description
// of where they live (opaque here).
struct KvHandover {
  std::vector<int32_t> generated;
  std::vector<int32_t> blocks;
  int block_size = 0;
  std::string source;
};

struct KvImport {
  int num_cached = 0;            // leading full blocks this instance had already
  std::vector<int32_t> fresh;    // blocks to fill: the prompt's full blocks [num_cached, num_cached + fresh.size())
};

// One stream's read, as the engine process performs it: remote block remote[i] into local[i].
struct KvImportJob {
  int64_t stream_id = 0;
  int64_t waited_us = 0;  // since the stream arrived: a read started late may outlive the export
  std::string source;
  std::vector<int32_t> remote, local;
};

// Upper bounds of the histograms of successful reads, declared here only (WorkerStatusPB carries
// them beside the counts): seconds, and bytes (1 MiB to 4 GiB).
inline constexpr double kMiB = 1 << 20;
inline constexpr std::array<double, 10> kKvReadSecondsBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                                0.025,  0.05,  0.1,    0.25,  1.0};
inline constexpr std::array<double, 7> kKvReadBytesBounds = {kMiB,        8 * kMiB,    64 * kMiB,  256 * kMiB,
                                                             1024 * kMiB, 2048 * kMiB, 4096 * kMiB};

// Counts per bucket, not cumulative (Prometheus' le: a value v counts in the first bucket whose
// bound b has v <= b; the last, +Inf, takes the rest). N + 1 integers: copied with the stats.
template <size_t N>
struct BucketCounts {
  std::array<int64_t, N + 1> counts{};
  void observe(const std::array<double, N>& bounds, double v) {
    counts[std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin()]++;
  }
};

// Since start: what left (exports) and what came (the engine process's reads, as it reports them).
// import_us and import_bytes are the histograms' sums; their counts sum to imports - failures.
struct KvTransferStats {
  int64_t exported_blocks = 0;
  int64_t imported_blocks = 0, import_bytes = 0, import_us = 0, imports = 0, failures = 0;
  BucketCounts<kKvReadSecondsBounds.size()> read_seconds;
  BucketCounts<kKvReadBytesBounds.size()> read_bytes;
};

class KvHandoff {
 public:
  KvHandoff(KVCacheManager& kv, int64_t export_timeout_us) : kv_(kv), export_timeout_us_(export_timeout_us) {}

  // Keeps `table` for export `id`, whose first num_exported blocks a decode instance reads (freed
  // at once when release(id) came first).
  void adopt(int64_t id, BlockTable table, int num_exported, int64_t now_us);
  // The decode instance read them: frees them. An id not adopted yet is remembered until its
  // deadline, so that its adopt() frees at once (a stream's last step may still be in flight).
  void release(int64_t id, int64_t now_us);

  // Reserves blocks for the first `num_blocks` full blocks of `tokens` (n of them, n >
  // num_blocks * block_size): those cached here are taken as they are, fresh ones for the rest.
  // Fewer than asked when the cache lacks room (none: num_cached + fresh.size() == 0 is a valid
  // answer, the prompt is then recomputed).
  KvImport begin_import(int64_t id, const int32_t* tokens, int n, int num_blocks);
  // The transfer into `fresh` ended: ok publishes the blocks (their tokens are the prompt's), else
  // they are freed unpublished. Unknown ids are ignored. bytes, us: the read's, for the statistics.
  void end_import(int64_t id, bool ok, int64_t bytes = 0, int64_t us = 0);
  const KvTransferStats& stats() const { return stats_; }

  // Frees exports and release notes past their deadline (a decode instance that never read).
  void expire(int64_t now_us);
  int num_exports() const { return static_cast<int>(exports_.size()); }
  int num_imports() const { return static_cast<int>(imports_.size()); }
  int64_t expired() const { return expired_; }

 private:
  struct Held {
    BlockTable table;           // empty for a release that came before its adopt
    int64_t deadline_us = 0;
    std::vector<int32_t> tokens;  // imports: the tokens their blocks hold
    int num_fresh = 0;            // imports: blocks read (the rest were cached here)
  };
  KVCacheManager& kv_;
  int64_t export_timeout_us_;
  int64_t expired_ = 0;
  KvTransferStats stats_;
  std::unordered_map<int64_t, Held> exports_, released_early_, imports_;
};

}  // namespace rtp_llm
