"""A frontend process: the HTTP API on start_port (SO_REUSEPORT: several frontends share it),
talking to the backend's RpcService on start_port + 1."""

import asyncio
import logging
import os
import signal
import sys

from aiohttp import web

from rtp_llm.config.model_config import REFUSED_EXIT, ModelRefused
from rtp_llm.config.server_config import ServerConfig, parse_server_config

log = logging.getLogger("rtp_llm.frontend")


async def _serve(config: ServerConfig) -> None:
    from rtp_llm.frontend.app import Frontend
    from rtp_llm.frontend.backend_client import BackendClient
    from rtp_llm.model_loader import CheckpointError, load_tokenizer

    tokenizer = load_tokenizer(config.checkpoint_path, config.tokenizer_path)
    if tokenizer is None:
        raise CheckpointError("it has no tokenizer: pass --tokenizer_path")
    client = BackendClient(config.rpc_address, config.max_queue_size)
    if config.role_type == "PREFILL":  # requests continue on the DECODE instance (rtp_llm/pd/)
        from rtp_llm.pd.prefill_entry import PrefillEntry

        decode = config.pd().decode_address
        client = PrefillEntry(client, BackendClient(decode, config.max_queue_size, wait_for_ready=False), decode)
    name = os.path.basename(os.path.normpath(config.checkpoint_path))
    # Per frontend process (SO_REUSEPORT spreads connections unevenly, so a share of a global
    # limit would refuse requests while another frontend idles).
    frontend = Frontend(tokenizer, client, name, config.concurrency_limit, config.api_key, config.max_body_size,
                        config.default_timeout_ms, config.engine_stall_timeout_s, config.stream_interval,
                        config.reasoning_parser, config.tool_call_parser)
    # handler_cancellation: a client that goes away cancels its handler, which cancels the
    # gRPC calls, so the engine stops generating for it (streaming or not).
    runner = web.AppRunner(frontend.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.start_port, reuse_port=True)
    await site.start()
    log.info("frontend %d listening on :%d", os.getpid(), config.start_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # Drain: new requests get 503, those in flight finish (bounded), then the port closes.
    frontend.draining = True
    for _ in range(600):
        if frontend.in_flight == 0:
            break
        await asyncio.sleep(0.1)
    await runner.cleanup()
    await client.close()


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_server_config(argv, __doc__)
    try:
        asyncio.run(_serve(config))
    except ModelRefused as e:  # (the user's input, not a bug: one line, as the backend's)
        log.error("cannot serve --checkpoint_path=%s: %s", config.checkpoint_path, e)
        return REFUSED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
