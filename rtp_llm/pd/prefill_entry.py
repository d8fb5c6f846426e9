"""A PREFILL instance's frontend view of the engine, with BackendClient's interface (the routes
cannot tell it from one): each request's prompt and first token run on this instance's engine
(can_use_pd_separation); unless that token ended the request, it continues on the DECODE
instance (its RPC service: one multiplexed call per frontend, as to a local engine), which reads
the prompt's KV blocks from here (rtp_llm/pd/handoff.py) and generates the rest. The client
sees one stream: the first token from here, then the decode instance's.

Blocks kept here are released (RemoteFinish) once the decode instance's first output arrives:
it runs only after its read ended. A request that ends before that (cancelled, failed) leaves
them to the engine's timeout (kv_export_timeout_ms): its read may still be under way there."""

import dataclasses
import logging
from typing import AsyncIterator, List, Optional, Tuple

from rtp_llm.config.grammar import GRAMMAR_FIELDS
from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2 as pb
from rtp_llm.frontend.backend_client import BackendClient, BackendError, Chunk

log = logging.getLogger("rtp_llm.pd")


def hands_off(config: pb.GenerateConfigPB) -> bool:
    """Whether a request may continue on the decode instance. A grammar's matcher state lives with
    the engine that sampled: such requests run whole here."""
    return not any(config.HasField(name) for name in GRAMMAR_FIELDS)


def decode_config(config: pb.GenerateConfigPB) -> pb.GenerateConfigPB:
    """The request as the decode instance runs it: prompt log-probs came with the first token."""
    out = pb.GenerateConfigPB()
    out.CopyFrom(config)
    out.ClearField("prompt_logprobs")
    out.can_use_pd_separation = False
    return out


class PrefillEntry:
    def __init__(self, local: BackendClient, decode: BackendClient, decode_address: str):
        self.local, self.decode, self.decode_address = local, decode, decode_address

    async def health(self, timeout: float = 2.0, wait_for_ready: bool = False) -> bool:
        return await self.local.health(timeout, wait_for_ready) and await self.decode.health(timeout, wait_for_ready)

    async def peer_problem(self) -> Optional[str]:
        """Why the decode instance cannot take requests (None: it can)."""
        if await self.decode.health(timeout=2.0, wait_for_ready=True):
            return None
        return f"the DECODE instance at --remote_rpc_server_ip={self.decode_address} is not reachable"

    async def worker_status(self, timeout: float = 5.0, wait_for_ready: bool = False) -> pb.WorkerStatusPB:
        return await self.local.worker_status(timeout, wait_for_ready)

    async def cache_status(self) -> pb.CacheStatusPB:
        return await self.local.cache_status()

    async def close(self):
        await self.local.close()
        await self.decode.close()

    async def generate(self, token_ids: List[int], config: pb.GenerateConfigPB, request_id: int = 0,
                       handover: Optional[Tuple[List[int], pb.KvExportPB]] = None) -> AsyncIterator[Chunk]:
        if not hands_off(config):
            async for chunk in self.local.generate(token_ids, config, request_id):
                yield chunk
            return
        prefill = pb.GenerateConfigPB()
        prefill.CopyFrom(config)
        prefill.can_use_pd_separation = True
        prefill.is_streaming = False  # one token: one update
        first: Optional[Chunk] = None
        async for first in self.local.generate(token_ids, prefill, request_id):
            pass
        if first is None or first.kv_export is None:  # the first token ended the request here
            if first is not None:
                yield first
            return
        export = first.kv_export
        yield dataclasses.replace(first, finished=False, finish_reason=None, kv_export=None)
        released = False
        try:
            async for chunk in self.decode.generate(token_ids, decode_config(config), request_id,
                                                    (first.new_ids, export)):
                if not released:  # the decode instance ran: its read of the blocks has ended
                    released = True
                    await self._release(export.export_id)
                yield chunk
        except BackendError as e:  # said as the decode instance's, so that an operator knows where to look
            raise BackendError(e.http_status, e.error_code, f"the DECODE instance at {self.decode_address}: "
                                                            f"{e.message}", e.field) from e
        finally:
            if not released:
                log.debug("export %d left to its timeout (the request ended before the decode instance ran)",
                          export.export_id)

    async def _release(self, export_id: int) -> None:
        try:
            await self.local.remote_finish(export_id)
        except Exception as e:  # the engine frees it at its timeout anyway
            log.warning("RemoteFinish(%d) failed: %s", export_id, e)
