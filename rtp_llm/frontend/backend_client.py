"""The frontend's view of the engine: its requests' token streams, all on one multiplexed
gRPC call (FrontendStreamService), and the engine's status."""

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import AsyncIterator, Dict, List, Optional, Tuple

import grpc

from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2 as pb
from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2_grpc as pb_grpc
from rtp_llm.frontend.errors import ErrorCode
from rtp_llm.ops.engine_core import decode_output


@dataclass
class Chunk:
    new_ids: List[int]
    finished: bool
    aux: dict = field(default_factory=dict)
    logprobs: Optional[List[float]] = None  # of new_ids, when the request asked for them
    finish_reason: Optional[str] = None     # "stop" | "length" once finished, as the core decided
    top_logprobs: Optional[list] = None     # per new id, its best alternatives [(id, log-prob)] (top_logprobs)
    # prompt_logprobs (in the chunk with the first tokens): prompt tokens 1..'s log-probs and,
    # with k > 0, their alternatives as top_logprobs'.
    prompt_logprobs: Optional[List[float]] = None
    prompt_top_logprobs: Optional[list] = None
    kv_export: Optional[pb.KvExportPB] = None  # handed off after this first token (rtp_llm/pd/prefill_entry.py)


class BackendError(Exception):
    """The engine refused or failed a request: `http_status`, upstream `error_code`, message;
    `field`: the request field it is about in the core's naming ("token_ids" for the prompt, a
    generate_config key, "" for none); `param`: that field as the request named it, once known
    (Frontend.events sets it)."""

    def __init__(self, http_status: int, error_code: int, message: str, field: str = ""):
        super().__init__(message)
        self.http_status = http_status
        self.error_code = error_code
        self.message = message
        self.field = field
        self.param: Optional[str] = None


_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,  # the waiting queue is full (--max_queue_size)
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.CANCELLED: 499,
}


_STATUS = {code.value[0]: code for code in grpc.StatusCode}


def _rpc_error(code: grpc.StatusCode, details: pb.ErrorDetailsPB, message: str) -> BackendError:
    """The engine's error for a request: the HTTP status its gRPC code maps to, upstream's
    error_code, the message and the field, from the ErrorDetailsPB the backend sent."""
    error_code = int(details.error_code) or ErrorCode.UNKNOWN_ERROR
    return BackendError(_HTTP.get(code, 500), error_code, details.error_message or message, details.field)


def _chunk(updates: List[pb.MultiplexUpdatePB]) -> Chunk:
    """One Chunk from a request's updates in arrival order: their tokens together, the last
    one's aux info and finish. A status (the request failed) is raised."""
    for u in updates:
        if u.status_code:
            code = _STATUS.get(u.status_code, grpc.StatusCode.UNKNOWN)
            raise _rpc_error(code, u.error, code.name)
    outs = [decode_output(u.output) for u in updates]
    last = outs[-1]
    prompt = next((o for o in outs if o.prompt_logprobs is not None), last)  # (at most one carries them)
    if len(outs) == 1:
        return Chunk(last.token_ids, last.finished, last.aux, last.logprobs, last.finish_reason, last.top_logprobs,
                     last.prompt_logprobs, last.prompt_top_logprobs, last.kv_export)
    ids = [t for o in outs for t in o.token_ids]
    logprobs = None if last.logprobs is None else [p for o in outs for p in o.logprobs or ()]
    top = None if last.top_logprobs is None else [a for o in outs for a in o.top_logprobs or ()]
    return Chunk(ids, last.finished, last.aux, logprobs, last.finish_reason, top, prompt.prompt_logprobs,
                 prompt.prompt_top_logprobs, last.kv_export)


class _Sink:
    """A request's updates, as the reader hands them over, until its consumer takes them."""

    __slots__ = ("updates", "error", "ready")

    def __init__(self):
        self.updates: List[pb.MultiplexUpdatePB] = []
        self.error: Optional[BackendError] = None  # the call broke
        self.ready = asyncio.Event()


class Multiplexer:
    """This frontend's one GenerateMultiplexed call (multiplex_call.h): requests go out on it
    under a tag, and one reader task hands each message's updates to their requests' sinks.
    The call opens with the first request and again after it broke (the backend restarted);
    when it breaks, every request on it fails with the call's status."""

    def __init__(self, stub: pb_grpc.FrontendStreamServiceStub, metadata, wait_for_ready: bool = True):
        self.stub, self.metadata, self.wait_for_ready = stub, metadata, wait_for_ready
        self.tags = itertools.count(1)
        self.sinks: Dict[int, _Sink] = {}
        self.outbox: Optional[asyncio.Queue] = None
        self.reader: Optional[asyncio.Task] = None

    def open(self, request: pb.GenerateInputPB) -> Tuple[int, _Sink]:
        if self.reader is None or self.reader.done():
            self._connect()
        tag, sink = next(self.tags), _Sink()
        self.sinks[tag] = sink
        self.outbox.put_nowait(pb.MultiplexRequestPB(tag=tag, input=request))
        return tag, sink

    def close(self, tag: int, cancel: bool) -> None:
        """The request's consumer is done; cancel: before its last update (the engine stops it)."""
        if self.sinks.pop(tag, None) is not None and cancel and self.outbox is not None:
            self.outbox.put_nowait(pb.MultiplexRequestPB(tag=tag, cancel=True))

    def stop(self) -> None:
        if self.reader is not None:
            self.reader.cancel()

    def _connect(self) -> None:
        outbox = self.outbox = asyncio.Queue()

        async def requests():
            while True:
                yield await outbox.get()

        # wait_for_ready: during a reconnect the call waits for the channel instead of failing.
        call = self.stub.GenerateMultiplexed(requests(), wait_for_ready=self.wait_for_ready, metadata=self.metadata)
        self.reader = asyncio.create_task(self._read(call))

    async def _read(self, call) -> None:
        error = BackendError(503, ErrorCode.UNKNOWN_ERROR, "the engine ended the frontend's stream")
        try:
            async for out in call:
                for u in out.updates:
                    sink = self.sinks.get(u.tag)
                    if sink is not None:  # else: closed meanwhile
                        sink.updates.append(u)
                        sink.ready.set()
        except grpc.aio.AioRpcError as e:
            error = _rpc_error(e.code(), pb.ErrorDetailsPB(), e.details() or str(e.code()))
        finally:
            # No await from here on: a request opened now goes on the next call.
            sinks, self.sinks, self.outbox = self.sinks, {}, None
            for sink in sinks.values():
                sink.error = error
                sink.ready.set()
            call.cancel()


class BackendClient:
    def __init__(self, address: str, max_queue_size: int = 0, wait_for_ready: bool = True):
        """wait_for_ready: requests wait while the channel (re)connects (this instance's own
        engine, which may start after the frontend); False fails them at once (another instance's,
        which may be gone)."""
        # Sent with every call: the engine refuses a stream when this many already wait.
        self.metadata = (("rtp-max-waiting", str(max_queue_size)),) if max_queue_size > 0 else None
        # The backend may come up after this frontend: reconnect quickly rather than with
        # gRPC's default backoff (up to two minutes).
        self.channel = grpc.aio.insecure_channel(address, options=[
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.max_receive_message_length", 64 << 20)])
        self.stub = pb_grpc.RpcServiceStub(self.channel)
        self.mux = Multiplexer(pb_grpc.FrontendStreamServiceStub(self.channel), self.metadata, wait_for_ready)

    async def health(self, timeout: float = 2.0, wait_for_ready: bool = False) -> bool:
        """wait_for_ready: wait (up to timeout) for a channel that is still connecting instead of
        failing at once."""
        try:
            r = await self.stub.CheckHealth(pb.EmptyPB(), timeout=timeout, wait_for_ready=wait_for_ready)
            return r.health == "ok"
        except grpc.aio.AioRpcError:
            return False

    async def worker_status(self, timeout: float = 5.0, wait_for_ready: bool = False) -> pb.WorkerStatusPB:
        return await self.stub.GetWorkerStatus(pb.StatusVersionPB(), timeout=timeout, wait_for_ready=wait_for_ready)

    async def cache_status(self) -> pb.CacheStatusPB:
        return await self.stub.GetCacheStatus(pb.CacheVersionPB(), timeout=5)

    async def peer_problem(self) -> Optional[str]:
        """Why another instance this one depends on cannot serve (a PREFILL instance's decode
        instance: rtp_llm/pd/prefill_entry.py); None: there is none."""
        return None

    async def remote_finish(self, request_id: int) -> None:
        """PREFILL: a decode instance read the blocks of export request_id."""
        await self.stub.RemoteFinish(pb.RemoteFinishRequestPB(request_id=request_id), timeout=5)

    async def generate(self, token_ids: List[int], config: pb.GenerateConfigPB, request_id: int = 0,
                       handover: Optional[Tuple[List[int], pb.KvExportPB]] = None) -> AsyncIterator[Chunk]:
        """Streams one sequence: each Chunk holds every token that arrived since the last one
        (one, usually; more when this frontend is busy). config.is_streaming False: one Chunk,
        at the end. Closing the iterator early (a stop string was hit, the client went away)
        cancels the request, and the engine frees its stream. handover (a DECODE instance's
        request): the tokens a PREFILL instance generated and its export (GenerateInputPB's
        generated_token_ids, kv_export)."""
        request = pb.GenerateInputPB(request_id=request_id, token_ids=token_ids)
        request.generate_config.CopyFrom(config)
        if handover is not None:
            request.generated_token_ids.extend(handover[0])
            request.kv_export.CopyFrom(handover[1])
        tag, sink = self.mux.open(request)
        ended = False
        try:
            while True:
                if not sink.updates and sink.error is None:
                    sink.ready.clear()
                    await sink.ready.wait()
                if not sink.updates:
                    ended = True  # the call broke: every request on it fails
                    raise sink.error
                updates, sink.updates = sink.updates, []
                ended = True  # if _chunk raises a status: a request's last update
                chunk = _chunk(updates)
                ended = chunk.finished
                yield chunk
                if ended:
                    return
        finally:
            self.mux.close(tag, cancel=not ended)

    async def close(self):
        self.mux.stop()
        await self.channel.close()
