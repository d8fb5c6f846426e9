"""Prefill/decode disaggregation's part of the engine core's C ABI (cpp/api/engine_api.h,
cpp/engine/kv_handoff.h), mixed into ops.engine_core.EngineCore: a PREFILL engine's export
source and releases, a DECODE engine's reads. Thread-safe, like the rest of the core."""

import ctypes
import logging
from typing import List, NamedTuple, Optional

import numpy as np

log = logging.getLogger("rtp_llm.engine_core")
_i32p = ctypes.POINTER(ctypes.c_int32)
_i64p = ctypes.POINTER(ctypes.c_int64)


def bind(lib) -> None:
    lib.rtp_llm_engine_set_kv_source.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32]
    lib.rtp_llm_engine_release_export.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.rtp_llm_engine_next_kv_import.restype = ctypes.c_int64
    lib.rtp_llm_engine_next_kv_import.argtypes = [ctypes.c_void_p, ctypes.c_int32, _i32p, _i32p, ctypes.c_int32, _i32p,
                                                  ctypes.c_char_p, ctypes.c_int32, _i32p, _i64p]
    lib.rtp_llm_engine_kv_import_done.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int64,
                                                  ctypes.c_int64]


class KvImportJob(NamedTuple):
    """One stream's read: remote block remote[i] into local[i], from the PREFILL instance that
    `source` (a serialized KvSourcePB) describes."""

    stream_id: int
    source: bytes
    remote: List[int]
    local: List[int]
    waited_s: float  # since the stream arrived


class KvHandoffCalls:
    """Needs the EngineCore's _lib, _handle, max_seq_len and block_size."""

    def set_kv_source(self, source: bytes):
        """PREFILL: the transfer engine's description of this pool, sent with every export."""
        self._lib.rtp_llm_engine_set_kv_source(self._handle, source, len(source))

    def release_export(self, export_id: int):
        self._lib.rtp_llm_engine_release_export(self._handle, export_id)

    def next_kv_import(self, timeout_ms: int) -> Optional[KvImportJob]:
        """DECODE: the next stream whose prompt's blocks are to be read (None when none came within
        timeout_ms). Blocks this thread only (ctypes releases the GIL); call from reader threads."""
        cap = -(-self.max_seq_len // self.block_size)
        remote, local = np.empty(cap, dtype=np.int32), np.empty(cap, dtype=np.int32)
        n, source_len, waited = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int64()
        source = ctypes.create_string_buffer(1 << 16)
        while True:
            sid = self._lib.rtp_llm_engine_next_kv_import(self._handle, timeout_ms, remote.ctypes.data_as(_i32p),
                                                          local.ctypes.data_as(_i32p), cap, ctypes.byref(n), source,
                                                          len(source), ctypes.byref(source_len), ctypes.byref(waited))
            if sid == -1:
                return None
            if sid >= 0:
                return KvImportJob(sid, source.raw[:source_len.value], remote[:n.value].tolist(),
                                   local[:n.value].tolist(), waited.value / 1e6)
            log.warning("a KV read was too large to take (%d blocks, %d-byte source): its prompt is recomputed",
                        n.value, source_len.value)

    def kv_import_done(self, stream_id: int, ok: bool, nbytes: int = 0, seconds: float = 0.0):
        """The read ended (ok: the blocks hold the KV); its size and time go into stats()."""
        self._lib.rtp_llm_engine_kv_import_done(self._handle, stream_id, int(ok), nbytes, int(seconds * 1e6))
