"""Prefill/decode disaggregation in the engine process (config/pd_config.py has the roles).

PREFILL: the pool is registered with the KV transfer engine, and its description (a KvSourcePB)
goes with every request the engine hands off (cpp/engine/kv_handoff.h: the export).
DECODE: reader threads take the streams whose prompt's blocks are on a PREFILL instance
(EngineCore.next_kv_import), read them into the blocks the core reserved, and report back
(kv_import_done), after which the stream runs. A read that fails is logged and counted; the
stream then recomputes its prompt (slower, never wrong). Reads run beside the engine's steps:
the blocks they fill belong to no stream until the core publishes them."""

import logging
import threading
import time
from typing import List, Optional

from rtp_llm.config.pd_config import KV_TRANSFER_ENGINE, PdConfig
from rtp_llm.pd.kv_transfer import KvTransfer, KvTransferError, open_transfer

log = logging.getLogger("rtp_llm.pd")

READERS = 4  # concurrent reads on a DECODE instance
# A PREFILL instance keeps a request's blocks for kv_export_timeout_ms (30 s by default) unless the
# DECODE instance's first output comes first: a read must end well within that, or it could read
# blocks the PREFILL instance has reused. So a read starts only within READ_START_S of the
# request's arrival and fails after READ_TIMEOUT_S (its prompt is then recomputed).
READ_START_S = 5.0
READ_TIMEOUT_S = 10.0


class KvHandoff:
    """This engine process's side of disaggregation; close() stops it."""

    def __init__(self, pd: PdConfig, engine):
        self.role = pd.role_type
        self.core = engine.core
        host = pd.advertised_host()
        self.transfer: KvTransfer = open_transfer(KV_TRANSFER_ENGINE, engine.kv_cache, engine.kv_blocks_dim, host,
                                                  pd.kv_transfer_port, f"rtp_llm-{self.role.lower()}-{host}-"
                                                                       f"{pd.kv_transfer_port}")
        self._stop = threading.Event()
        self._readers: List[threading.Thread] = []
        if self.role == "PREFILL":
            self.core.set_kv_source(self.transfer.source())
            log.info("PREFILL: KV blocks served by %s on %s:%d", KV_TRANSFER_ENGINE, host, pd.kv_transfer_port)
        else:
            self._readers = [threading.Thread(target=self._read_loop, name=f"rtp_llm-kv-reader-{i}", daemon=True)
                             for i in range(READERS)]
            for t in self._readers:
                t.start()
            log.info("DECODE: reading PREFILL instances' KV blocks with %s (%d readers)", KV_TRANSFER_ENGINE,
                     READERS)

    def _read_loop(self):
        while not self._stop.is_set():
            job = self.core.next_kv_import(200)
            if job is None:
                continue
            ok, nbytes, start = False, 0, time.perf_counter()
            try:
                if job.waited_s > READ_START_S:
                    raise KvTransferError(f"the request waited {job.waited_s:.1f} s for a reader (more than "
                                          f"{READ_START_S} s): its blocks may be gone")
                nbytes = self.transfer.read(job.source, job.remote, job.local, READ_TIMEOUT_S) if job.local else 0
                ok = True
            except KvTransferError as e:
                log.error("reading %d KV blocks for stream %d failed (its prompt is recomputed): %s", len(job.local),
                          job.stream_id, e)
            except Exception:  # a bug must not kill the reader: the stream would wait forever
                log.exception("reading KV blocks for stream %d failed", job.stream_id)
            finally:
                self.core.kv_import_done(job.stream_id, ok, nbytes, time.perf_counter() - start)

    def close(self):
        self._stop.set()
        for t in self._readers:
            t.join(timeout=5)
        self.transfer.close()


def start(pd: PdConfig, engine) -> Optional[KvHandoff]:
    """The engine process's part for pd.role_type (None for PDFUSION)."""
    return KvHandoff(pd, engine) if pd.disaggregated else None
