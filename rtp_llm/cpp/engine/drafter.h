// Drafters propose tokens a stream is likely to generate next; the scheduler runs them after
// the stream's last known token in one verification forward (scheduler.h, "Speculative
// decoding"). A drafter only proposes: whatever it returns, the sampled tokens decide what is
// kept, so a bad proposal costs compute, never correctness.
//
// Invariant: propose() reads the stream's known tokens only (prompt, then generated; nothing in
// flight) and writes at most max_tokens ids into out. Integers only, like the rest of the core.
#pragma once

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

}  // namespace rtp_llm
