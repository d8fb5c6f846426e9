// Drafters propose tokens a stream is likely to generate next; the scheduler runs them after
// the stream's last known token in one verification forward (scheduler.h, "Speculative
// decoding"). A drafter only proposes: whatever it returns, the sampled tokens decide what is
// kept, so a bad proposal costs compute, never correctness.
//
// Invariant: propose() reads the stream's known tokens only (prompt, then generated; nothing in
// flight) and writes at most max_tokens ids into out. Integers only, like the rest of the core.
#pragma once

#include <algorithm>
#include <cstdint>

namespace rtp_llm {

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to max_tokens proposed continuations of tokens[0, n) into out; returns how many (0: none).
  virtual int propose(const int32_t* tokens, int n, int max_tokens, int32_t* out) const = 0;
};

// Prompt lookup (upstream's sp_type "deterministic", vLLM's "ngram"): the last m tokens
// (m from max_match down to min_match) are looked up among the stream's earlier tokens; at the
// latest earlier occurrence, the tokens that followed it are proposed (up to max_tokens, and no
// further than the stream's last token). The longest suffix that matches wins: it is the most
// specific context. O(n * max_match) per call; no index is kept (the stream's tokens are short
// next to a step's forward).
class NgramDrafter : public Drafter {
 public:
  NgramDrafter(int min_match, int max_match) : min_match_(min_match), max_match_(max_match) {}
  int propose(const int32_t* tokens, int n, int max_tokens, int32_t* out) const override;

 private:
  int min_match_, max_match_;
};

// A draft model's drafts (upstream's sp_type "vanilla"): the core only reserves the positions.
// After the step is scheduled, the model runner's draft model proposes each drafting stream's
// tokens and writes them over those positions of the batch's token_ids before the forward
// (rtp_llm/async_decoder_engine/draft_model.py); commit verifies whatever they hold then.
// propose() reserves all max_tokens positions, each holding the stream's last token meanwhile (a
// valid id: a batch that runs unfilled costs acceptance, never correctness).
class DeferredDrafter : public Drafter {
 public:
  int propose(const int32_t* tokens, int n, int max_tokens, int32_t* out) const override {
    std::fill(out, out + max_tokens, tokens[n - 1]);
    return max_tokens;
  }
};

// How many tokens a stream drafts next, from how its last verified rounds went: every rejected
// draft is a row computed for nothing, which costs little where a step is bound by reading the
// weights (batch 1) and its full share where it is bound by compute (a batch of 16 on the CPU:
// docs/benchmarks.md). A fully accepted round doubles the allowance (up to max_drafts); a partly
// accepted one sets it to the accepted count plus one (the run that would have been kept, and one
// more to find where it ends); a round with nothing accepted at an allowance of 1 stops drafting
// for 1, 2, 4, ... up to kMaxBackoff of the stream's decode steps, until a round accepts again.
//
// Invariant: allowance() is in [0, max_drafts], 0 only while backing off; record() of a round
// with an accepted draft ends any backoff. Integers only.
class DraftPace {
 public:
  static constexpr int kMaxBackoff = 16;

  // The most drafts for the stream's next decode step (a step that could draft: counts it
  // while backing off).
  int allowance(int max_drafts);
  // A verified round: `drafted` (> 0) tokens proposed, the first `accepted` of them kept.
  void record(int drafted, int accepted, int max_drafts);

 private:
  int limit(int max_drafts) const { return limit_ > 0 ? std::min(limit_, max_drafts) : max_drafts; }

  int limit_ = 0;    // 0: max_drafts (no round verified yet)
  int skip_ = 0;     // decode steps left without drafting
  int backoff_ = 0;  // the next backoff's length (0: none yet)
};

}  // namespace rtp_llm
