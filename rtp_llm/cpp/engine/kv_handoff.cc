#include "rtp_llm/cpp/engine/kv_handoff.h"

#include <algorithm>
#include <utility>

namespace rtp_llm {

void KvHandoff::adopt(int64_t id, BlockTable table, int num_exported, int64_t now_us) {
  stats_.exported_blocks += num_exported;
  auto early = released_early_.find(id);
  if (early != released_early_.end()) {
    released_early_.erase(early);
    kv_.free(table);
    return;
  }
  Held& held = exports_[id];
  held.table = std::move(table);
  held.deadline_us = now_us + export_timeout_us_;
}

void KvHandoff::release(int64_t id, int64_t now_us) {
  auto it = exports_.find(id);
  if (it == exports_.end()) {
    released_early_[id].deadline_us = now_us + export_timeout_us_;
    return;
  }
  kv_.free(it->second.table);
  exports_.erase(it);
}

namespace {
// The first `n` blocks of a match (its count of unreferenced ones an upper bound: can_allocate stays safe).
PrefixMatch leading(const PrefixMatch& match, int n) {
  PrefixMatch out = match;
  n = std::min(n, static_cast<int>(match.blocks.size()));
  out.blocks.resize(n);
  out.hashes.resize(n);
  out.num_unreferenced = std::min(match.num_unreferenced, n);
  return out;
}
}  // namespace

KvImport KvHandoff::begin_import(int64_t id, const int32_t* tokens, int n, int num_blocks) {
  KvImport out;
  const int bs = kv_.block_size();
  num_blocks = std::max(0, std::min(num_blocks, (n - 1) / bs));  // the last token is never cached
  const PrefixMatch match = kv_.match_prefix(tokens, n);
  Held held;
  for (int want = num_blocks; want > 0; --want) {  // as many as fit; the stream recomputes the rest
    const PrefixMatch taken = leading(match, want);
    if (kv_.can_allocate(held.table, taken, want * bs)) {
      kv_.allocate(held.table, taken, want * bs);
      out.num_cached = static_cast<int>(taken.blocks.size());
      break;
    }
  }
  out.fresh.assign(held.table.blocks.begin() + out.num_cached, held.table.blocks.end());
  held.num_fresh = static_cast<int>(out.fresh.size());
  held.tokens.assign(tokens, tokens + held.table.blocks.size() * static_cast<size_t>(bs));
  imports_[id] = std::move(held);
  return out;
}

void KvHandoff::end_import(int64_t id, bool ok, int64_t bytes, int64_t us) {
  auto it = imports_.find(id);
  if (it == imports_.end()) return;
  Held& held = it->second;
  ++stats_.imports;
  if (ok) {
    stats_.imported_blocks += held.num_fresh;
    stats_.import_bytes += bytes;
    stats_.import_us += us;
    stats_.read_seconds.observe(kKvReadSecondsBounds, static_cast<double>(us) / 1e6);
    stats_.read_bytes.observe(kKvReadBytesBounds, static_cast<double>(bytes));
  } else {
    ++stats_.failures;
  }
  if (ok) kv_.publish_computed(held.table, held.tokens.data(), static_cast<int>(held.tokens.size()));
  kv_.free(held.table);  // published blocks stay cached (LRU) for the stream to take
  imports_.erase(it);
}

void KvHandoff::expire(int64_t now_us) {
  for (auto it = exports_.begin(); it != exports_.end();) {
    if (it->second.deadline_us > now_us) {
      ++it;
      continue;
    }
    kv_.free(it->second.table);
    it = exports_.erase(it);
    ++expired_;
  }
  for (auto it = released_early_.begin(); it != released_early_.end();) {
    it = it->second.deadline_us <= now_us ? released_early_.erase(it) : std::next(it);
  }
}

}  // namespace rtp_llm
