"""The fused MoE's tile configurations (kernels/moe.py), measured best per token count on a
device for one layer shape by `python -m rtp_llm.tools.bench_moe kernel --sweep --tuned_out F`
(readings in docs/benchmarks.md). A shape without an entry takes moe_config's rule of thumb.

Keys: (device name, E experts, I intermediate slice, H hidden, K top-k, dtype) -> {tokens:
(block_m, block_n, block_k, group_m, num_warps, num_stages)}; a step takes the entry of the nearest token
count. RTP_LLM_MOE_TUNED names a JSON file of more entries (what --tuned_out writes: a list of
{"key": [...], "configs": {"tokens": [...]}}), which win over these; read when a step shape first
asks (kernels/moe.py resolves each shape's tiles once)."""

import functools
import json
import os
from typing import Dict, Optional, Tuple

Key = Tuple[str, int, int, int, int, str]
Table = Dict[int, Tuple[int, int, int, int, int, int]]

TUNED: Dict[Key, Table] = {
    # Qwen3-30B-A3B (TP 1), session 21's sweep.
    ('NVIDIA H200', 128, 768, 2048, 8, 'bfloat16'): {
        1: (16, 32, 128, 1, 4, 4),
        2: (16, 32, 64, 1, 4, 4),
        4: (16, 64, 64, 1, 4, 3),
        8: (16, 32, 128, 1, 4, 3),
        16: (16, 32, 128, 1, 4, 4),
        32: (16, 32, 128, 1, 4, 4),
        64: (16, 32, 128, 1, 4, 4),
        128: (16, 32, 128, 1, 4, 4),
        256: (32, 64, 128, 1, 4, 3),
        512: (64, 64, 64, 1, 4, 3),
        1024: (64, 64, 64, 1, 4, 3),
        2048: (128, 128, 64, 1, 8, 3),
        4096: (128, 128, 64, 1, 8, 3),
        8192: (128, 128, 64, 1, 8, 3),
    },
}


def to_json(key: Key, table: Table) -> dict:
    return {"key": list(key), "configs": {str(t): list(c) for t, c in sorted(table.items())}}


@functools.lru_cache(maxsize=None)
def _extra(path: str) -> Dict[Key, Table]:
    with open(path) as f:
        entries = json.load(f)
    return {tuple(e["key"]): {int(t): tuple(c) for t, c in e["configs"].items()} for e in entries}


def tuned_table(key: Key) -> Optional[Table]:
    path = os.environ.get("RTP_LLM_MOE_TUNED")
    if path:
        table = _extra(path).get(key)
        if table:
            return table
    return TUNED.get(key)
