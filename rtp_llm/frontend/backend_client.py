"""The frontend's view of the engine: one gRPC GenerateStreamCall per sequence."""

from dataclasses import dataclass, field
from typing import AsyncIterator, List, Optional

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


class BackendClient:
    def __init__(self, address: str, max_queue_size: int = 0):
        # Sent with every call: the engine refuses a stream when this many already wait.
        self.metadata = (("rtp-max-waiting", str(max_queue_size)),) if max_queue_size > 0 else None
        # The backend may come up after this frontend: reconnect quickly rather than with
        # gRPC's default backoff (up to two minutes).
        self.channel = grpc.aio.insecure_channel(address, options=[
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.max_receive_message_length", 64 << 20)])
        self.stub = pb_grpc.RpcServiceStub(self.channel)

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

    async def generate(self, token_ids: List[int], config: pb.GenerateConfigPB,
                       request_id: int = 0) -> AsyncIterator[Chunk]:
        """Streams the new tokens of one sequence. Closing the iterator early (a stop string
        was hit, the client went away) cancels the call, and the engine frees the stream."""
        request = pb.GenerateInputPB(request_id=request_id, token_ids=token_ids)
        request.generate_config.CopyFrom(config)
        request.generate_config.is_streaming = True
        # wait_for_ready: a request during a reconnect waits for the channel instead of failing.
        call = self.stub.GenerateStreamCall(request, wait_for_ready=True, metadata=self.metadata)
        try:
            async for out in call:
                d = decode_output(out)
                yield Chunk(d.token_ids, d.finished, d.aux, d.logprobs, d.finish_reason)
        except grpc.aio.AioRpcError as e:
            code, message = e.code(), e.details() or str(e.code())
            error_code, field_name = ErrorCode.UNKNOWN_ERROR, ""
            trailing = dict(e.trailing_metadata() or ())
            raw = trailing.get("grpc-status-details-bin")
            if raw:
                details = pb.ErrorDetailsPB()
                try:
                    details.ParseFromString(raw)
                    error_code, message = int(details.error_code), details.error_message or message
                    field_name = details.field
                except Exception:
                    pass
            raise BackendError(_HTTP.get(code, 500), error_code, message, field_name) from None
        finally:
            call.cancel()

    async def close(self):
        await self.channel.close()
