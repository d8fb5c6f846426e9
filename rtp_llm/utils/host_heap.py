"""Settles the host heap once long work (loading, warm-up, a tokenizer read for grammars) is
done and steady serving begins:
- Python's cyclic collector stops scanning what exists then (gc.freeze). The engine thread's
  steps allocate short-lived objects; each few hundred steps trigger a collection, and a full one
  walked every long-lived object (modules, a tokenizer's tables): on the H200 host a 105 ms
  stall of one step of 64 streams under a JSON schema (docs/serving_benchmarks.md, session 19).
  vLLM freezes its heap after start-up for the same reason.
- the C heap's freed pages go back to the OS (malloc_trim). Loading frees large temporaries (a
  file's blocks unpacked, fused and transposed copies), but glibc keeps freed pages inside its
  heap and arenas mapped, and they count in the process's resident memory until malloc_trim
  releases them (measured on Qwen2.5-Coder-0.5B Q4_K_M on the CPU: docs/benchmarks.md)."""

import ctypes
import gc


def settle_heap() -> bool:
    """Collects what is garbage now, freezes the rest out of later collections, then trims the
    C heap. True when the C library released memory; False where it did not or cannot (not
    glibc)."""
    gc.collect()
    gc.freeze()
    return release_freed_heap()


def release_freed_heap() -> bool:
    """The C heap's freed pages back to the OS: True when the C library released memory."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
