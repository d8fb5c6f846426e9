"""Settles the host heap once long work (loading, warm-up, a tokenizer read for grammars) is
done and steady serving begins:
- Python's cyclic collector stops scanning what exists then (gc.freeze). The engine thread's
  steps allocate short-lived objects; each few hundred steps trigger a collection, and a full one
  walked every long-lived object (modules, a tokenizer's tables): on the H200 host a 105 ms
  stall of one step of 64 streams under a JSON schema (docs/serving_benchmarks.md, session 19).
  vLLM freezes its heap after start-up for the same reason. What the steps allocate dies young,
  mostly by reference count, so the young generation is collected every YOUNG_COLLECTION_EVERY
  allocations instead of CPython's 700: each collection walks only what is still alive, about
  as much either way, and on the H200 host collections every few steps were a measurable part of
  a schema step's host time (docs/serving_benchmarks.md, session 20).
- the C heap's freed pages go back to the OS (malloc_trim). Loading frees large temporaries (a
  file's blocks unpacked, fused and transposed copies), but glibc keeps freed pages inside its
  heap and arenas mapped, and they count in the process's resident memory until malloc_trim
  releases them (measured on Qwen2.5-Coder-0.5B Q4_K_M on the CPU: docs/benchmarks.md)."""

import ctypes
import gc

YOUNG_COLLECTION_EVERY = 20_000  # container allocations (CPython's default: 700)


def settle_heap() -> bool:
    """Collects what is garbage now, freezes the rest out of later collections, then trims the
    C heap. True when the C library released memory; False where it did not or cannot (not
    glibc)."""
    gc.collect()
    gc.freeze()
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(YOUNG_COLLECTION_EVERY, young), older, oldest)
    return release_freed_heap()


def release_freed_heap() -> bool:
    """The C heap's freed pages back to the OS: True when the C library released memory."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
