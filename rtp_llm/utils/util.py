"""Upstream RTP-LLM's helpers for a server started as a subprocess (its tutorials use them):

    proc = subprocess.Popen([sys.executable, "-m", "rtp_llm.start_server", "--checkpoint_path=...",
                             "--start_port=8088"])
    if wait_sever_done(proc, 8088):   # (upstream's spelling)
        ...
    stop_server(proc)

Same contract as upstream's: wait_sever_done polls /health once a second and returns True once
it answers 200, False when the process exits or `timeout` seconds pass; stop_server stops the
server and every process it started, and returns True."""

import logging
import subprocess
import time
import urllib.request

log = logging.getLogger(__name__)


def wait_sever_done(server_process: subprocess.Popen, port: int, timeout: int = 1600,
                    health_path: str = "/health") -> bool:
    url = f"http://localhost:{int(port)}{health_path}"
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass  # not listening yet, or 503 while it starts
        if server_process.poll() is not None:
            log.warning("the server (pid %d) exited with %s before it was ready", server_process.pid,
                        server_process.returncode)
            return False
        if time.time() > deadline:
            log.warning("the server on port %s was not ready within %s s", port, timeout)
            return False
        time.sleep(1)


def stop_server(server_process: subprocess.Popen, timeout: float = 60) -> bool:
    """SIGTERM to the launcher: it drains the frontends and stops the backends (which die with
    it in any case); killed if it has not exited within `timeout` seconds."""
    if server_process is None or server_process.poll() is not None:
        return True
    server_process.terminate()
    try:
        server_process.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("the server (pid %d) did not stop within %s s: killed", server_process.pid, timeout)
        server_process.kill()
        server_process.wait()
    return True
