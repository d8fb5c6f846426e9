"""Hands the C heap's freed pages back to the OS once loading is done. Loading frees large
temporaries (a file's blocks unpacked, fused and transposed copies), but glibc keeps freed pages
inside its heap and arenas mapped, and they count in the process's resident memory until
malloc_trim releases them (measured on Qwen2.5-Coder-0.5B Q4_K_M on the CPU: docs/benchmarks.md)."""

import ctypes


def release_freed_heap() -> bool:
    """True when the C library released memory; False where it did not or cannot (not glibc)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
