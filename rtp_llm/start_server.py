"""python -m rtp_llm.start_server --checkpoint_path=DIR_OR_GGUF [--model_type=qwen_3]
[--start_port=8088] [--frontend_server_count=N] ...   (every flag has an env twin: START_PORT)

Starts the backend processes of this node's ranks (one unless --tp_size > 1: one per local
GPU; rank 0 has the engine core and gRPC on start_port + 1) and, on the node with rank 0, N
frontend processes (HTTP on start_port); supervises them and exits non-zero if one dies.
SIGTERM/SIGINT stop the frontends first (they finish requests in flight), then rank 0, which
stops the other ranks. Every child dies with the launcher, even one killed with SIGKILL (on
Linux): no backend or frontend outlives it holding the ports, RAM or GPUs."""

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time

from rtp_llm.config.model_config import REFUSED_EXIT
from rtp_llm.config.server_config import parse_server_config

log = logging.getLogger("rtp_llm.start_server")

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def dies_with_launcher():
    """A Popen preexec_fn (None where the OS has no prctl) that makes the child get SIGKILL when
    the launcher dies. PR_SET_PDEATHSIG follows the thread that forked the child: the launcher
    starts every child from its main thread, which lives as long as the launcher. The launcher
    may die between fork and prctl, when the child has already been handed to another parent:
    the child then sees a parent that is not the launcher and exits at once."""
    if not sys.platform.startswith("linux"):
        return None
    launcher = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork, not in the child
    sigkill = int(signal.SIGKILL)

    def preexec():
        if prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0) != 0 or os.getppid() != launcher:
            os._exit(1)

    return preexec


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
    preexec = dies_with_launcher()
    backends = [subprocess.Popen([py, "-m", "rtp_llm.start_backend_server", *args, f"--world_rank={rank}"], env=env,
                                 preexec_fn=preexec) for rank in ranks]
    has_core = 0 in ranks
    frontends = [subprocess.Popen([py, "-m", "rtp_llm.start_frontend_server", *args], env=env, preexec_fn=preexec)
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
            if p.returncode == REFUSED_EXIT:
                log.error("%s refused the model (its error above): stopping the server", name)
                code = REFUSED_EXIT
            else:
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
