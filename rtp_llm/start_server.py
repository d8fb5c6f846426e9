"""python -m rtp_llm.start_server --checkpoint_path=DIR_OR_GGUF [--model_type=qwen_3]
[--start_port=8088] [--frontend_server_count=4] ...   (every flag has an env twin: START_PORT)

Starts the backend processes of this node's ranks (one unless --tp_size > 1: one per local
GPU; rank 0 has the engine core and gRPC on start_port + 1) and, on the node with rank 0, N
frontend processes (HTTP on start_port); supervises them and exits non-zero if one dies.
SIGTERM/SIGINT stop the frontends first (they finish requests in flight), then rank 0, which
stops the other ranks."""

import logging
import os
import signal
import subprocess
import sys
import time

from rtp_llm.config.server_config import parse_server_config

log = logging.getLogger("rtp_llm.start_server")


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = parse_server_config(argv, __doc__)
        ranks = config.local_ranks
    except ValueError as e:
        log.error("%s", e)
        return 2
    args = config.to_args()
    env = dict(os.environ)
    if config.api_key:
        env["API_KEY"] = config.api_key
    py = sys.executable
    args = [a for a in args if not a.startswith("--world_rank=")]
    backends = [subprocess.Popen([py, "-m", "rtp_llm.start_backend_server", *args, f"--world_rank={rank}"], env=env)
                for rank in ranks]
    has_core = 0 in ranks
    frontends = [subprocess.Popen([py, "-m", "rtp_llm.start_frontend_server", *args], env=env)
                 for _ in range(config.frontend_server_count if has_core else 0)]
    children = ([(f"backend rank {r}", p) for r, p in zip(ranks, backends)]
                + [(f"frontend {i}", p) for i, p in enumerate(frontends)])
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    code = 0
    while not stopping:
        dead = [(name, p) for name, p in children if p.poll() is not None]
        if dead:
            name, p = dead[0]
            log.error("%s (pid %d) exited with code %s: stopping the server", name, p.pid, p.returncode)
            code = 1
            break
        time.sleep(0.2)
    for p in frontends:  # frontends first: they drain, then the engine goes
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in frontends:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    # Rank 0 first: stopping, it tells the other ranks to stop (a rank killed first would make
    # rank 0's last broadcast fail). A node without rank 0 signals its own ranks.
    order = backends if has_core else backends[::-1]
    for i, p in enumerate(order):
        if p.poll() is None and (i == 0 or not has_core):
            p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    return code


if __name__ == "__main__":
    sys.exit(main())
