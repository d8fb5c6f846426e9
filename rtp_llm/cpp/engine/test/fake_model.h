// A deterministic stand-in for a model, for tests and benchmarks. It keeps a "KV cache" of
// token ids indexed by slot, writes each step's tokens through slot_mapping, and computes a
// sampled stream's next token from its whole context read back through its block table. So
// a wrong block table, slot mapping or prefix-cache hit changes the output, and outputs
// equal `reference()` exactly when the bookkeeping is right.
//
// period > 0 makes it repetitive, so speculative drafts get accepted: the next token copies the
// one `period` back (read through the KV cache like the rest), except at every 7th position,
// where the context's hash is taken as usual (drafts are rejected there). A verification step's
// rows (draft_lens) are each computed from their own prefix of the context.
#pragma once

#include <cstdint>
#include <vector>

#include "rtp_llm/cpp/engine/step_batch.h"

namespace rtp_llm::testing {

class FakeModel {
 public:
  FakeModel(int num_blocks, int block_size, int vocab = 1000, int period = 0)
      : block_size_(block_size), vocab_(vocab), period_(period), kv_(static_cast<size_t>(num_blocks) * block_size, -1) {}

  static int32_t next_token(const int32_t* seq, int n, int vocab, int period = 0) {
    if (period > 0 && n >= period && n % 7 != 0) return seq[n - period];
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; ++i) h = (h ^ static_cast<uint32_t>(seq[i])) * 1099511628211ULL;
    return static_cast<int32_t>((h >> 17) % static_cast<uint64_t>(vocab));
  }

  // The tokens a correct engine generates for `prompt` (no EOS, no stop words).
  std::vector<int32_t> reference(std::vector<int32_t> seq, int max_new_tokens) const {
    std::vector<int32_t> out;
    for (int i = 0; i < max_new_tokens; ++i) {
      out.push_back(next_token(seq.data(), static_cast<int>(seq.size()), vocab_, period_));
      seq.push_back(out.back());
    }
    return out;
  }

  // One step: returns the sampled tokens (batch order of do_sample streams; with drafts, each
  // such stream's last 1 + draft_lens rows). `Batch` is a
  // StepBatch or the C ABI's RtpStepBatch (same field names). `prev`: the tokens sampled by
  // the step before, for a batch scheduled ahead of them (token id -1 - r is prev[r]).
  template <class Batch>
  std::vector<int32_t> run(const Batch& b, const std::vector<int32_t>* prev = nullptr) {
    for (int t = 0; t < b.num_tokens; ++t) {
      const int32_t id = b.token_ids[t];
      kv_[b.slot_mapping[t]] = id >= 0 ? id : prev->at(static_cast<size_t>(-1 - id));
    }
    std::vector<int32_t> sampled;
    for (int i = 0; i < b.num_streams; ++i) {
      if (!b.do_sample[i]) continue;
      context_.resize(b.context_lens[i]);
      const int32_t* row = &b.block_tables[0] + static_cast<size_t>(i) * b.block_table_stride;
      for (int p = 0; p < b.context_lens[i]; ++p) {
        context_[p] = kv_[static_cast<size_t>(row[p / block_size_]) * block_size_ + p % block_size_];
      }
      const int d = b.draft_lens[i];
      for (int r = 0; r <= d; ++r) {
        sampled.push_back(next_token(context_.data(), b.context_lens[i] - d + r, vocab_, period_));
      }
    }
    return sampled;
  }

  // The KV transfer of prefill/decode disaggregation: block `from` of `src` into this one's block `to`.
  void copy_block(const FakeModel& src, int from, int to) {
    for (int o = 0; o < block_size_; ++o) {
      kv_[static_cast<size_t>(to) * block_size_ + o] = src.kv_[static_cast<size_t>(from) * block_size_ + o];
    }
  }

  // A prompt row's "log-prob" of its target after the context `seq` [n] (deterministic, <= 0).
  static float prompt_logprob(const int32_t* seq, int n, int32_t target, int vocab) {
    return -static_cast<float>((next_token(seq, n, vocab) + target) % 997) / 100.0f;
  }

  // What a correct engine records for `prompt`: token q's prompt log-prob at q - 1.
  std::vector<float> reference_prompt(const std::vector<int32_t>& prompt) const {
    std::vector<float> out;
    for (size_t q = 1; q < prompt.size(); ++q) {
      out.push_back(prompt_logprob(prompt.data(), static_cast<int>(q), prompt[q], vocab_));
    }
    return out;
  }

  // The prompt rows of the batch last run (prompt_targets >= 0, token order), each from its
  // context read back through the block table, so a wrong target or KV read shows.
  template <class Batch>
  std::vector<float> prompt_rows(const Batch& b) {
    std::vector<float> out;
    for (int i = 0; i < b.num_streams; ++i) {
      const int32_t* row = &b.block_tables[0] + static_cast<size_t>(i) * b.block_table_stride;
      for (int t = b.query_starts[i]; t < b.query_starts[i + 1]; ++t) {
        if (b.prompt_targets[t] < 0) continue;
        const int n = b.positions[t] + 1;
        context_.resize(n);
        for (int p = 0; p < n; ++p) {
          context_[p] = kv_[static_cast<size_t>(row[p / block_size_]) * block_size_ + p % block_size_];
        }
        out.push_back(prompt_logprob(context_.data(), n, b.prompt_targets[t], vocab_));
      }
    }
    return out;
  }

  int vocab() const { return vocab_; }

 private:
  int block_size_;
  int vocab_;
  int period_;
  std::vector<int32_t> kv_;
  std::vector<int32_t> context_;
};

}  // namespace rtp_llm::testing
