"""The sampler's rows of a step with drafts (speculative decoding; rtp_llm/cpp/engine/scheduler.h):
per drafting stream with d drafts, its 1 + d rows sample the tokens after its last known token
and after each draft, so row j is sampled as the plain step would sample the token after the
stream's tokens followed by drafts 0..j-1. StepBatch.rows repeats the stream's [S] arrays per
row; this adds what differs by row:

- draft_tokens [N] int32: the draft row j verifies (draft j; -1 on row d, the bonus row, and on
  the rows of streams without drafts), and draft_at [N] its query token (-1 likewise): where a
  drafter left the drafts on the device (draft_model.DeviceDrafts), draft_tokens holds the core's
  placeholders until commit, and draft_values [N] (device; else None) the drafts;
- num_generated [N]: the stream's plus j (the index of the token the row samples: a seeded row's
  position, and the split of its history into prompt and output for the penalties);
- a penalized row's history (history_lens > 0): the stream's (prompt, then generated: complete,
  nothing of it in flight) followed by drafts 0..j-1, so repetition / presence / frequency
  penalties and no_repeat_ngram_size count the drafts before the row as generated tokens."""

import numpy as np


def with_draft_positions(b, rows, streams: np.ndarray) -> None:
    """Sets `rows` (b.rows(streams)'s SamplingRows) as above. streams: b.sampled_streams()' index
    [N], each drafting stream's 1 + d rows together in position order. A stream's drafts are its
    last d query tokens: draft j is token_ids[query_starts[i + 1] - d + j]."""
    n = len(streams)
    first = np.r_[True, streams[1:] != streams[:-1]]
    j = np.arange(n) - np.maximum.accumulate(np.where(first, np.arange(n), 0))
    d = b.draft_lens[streams]
    draft0 = b.query_starts[streams + 1] - d  # [N] token index of the row's stream's first draft
    has = j < d
    rows.draft_at = np.where(has, draft0 + j, -1).astype(np.int64)
    rows.draft_tokens = np.full(n, -1, np.int32)
    rows.draft_tokens[has] = b.token_ids[rows.draft_at[has]]
    rows.num_generated = rows.num_generated + j.astype(rows.num_generated.dtype)
    if ((rows.history_lens > 0) & (j > 0)).any():
        _extend_histories(b.token_ids, rows, draft0, j)


def _extend_histories(token_ids: np.ndarray, rows, draft0: np.ndarray, j: np.ndarray) -> None:
    """Gives each penalized row its own history: the stream's, then its j drafts before the row
    (token_ids[draft0 +: j]). history_tokens is rebuilt row by row (rows without history keep
    length 0); history_starts / history_lens are rows' own copies (masked arrays)."""
    pieces, at = [], 0
    starts = np.zeros(len(j), np.int32)
    lens = rows.history_lens.copy()
    for r in np.nonzero(rows.history_lens > 0)[0]:
        h = rows.history_tokens[rows.history_starts[r]:rows.history_starts[r] + rows.history_lens[r]]
        pieces += [h, token_ids[draft0[r]:draft0[r] + j[r]]]
        starts[r], lens[r] = at, len(h) + j[r]
        at += lens[r]
    rows.history_tokens = np.concatenate(pieces).astype(np.int32)
    rows.history_starts, rows.history_lens = starts, lens
