"""The launcher's children die with it: a launcher killed with SIGKILL (no handler runs, so it
stops nobody) leaves no backend or frontend running, and its HTTP and gRPC ports are free
again (a wait with a generous deadline, not a speed assertion). Its preexec_fn, directly: the
child asks for SIGKILL on its parent's death, and a child whose launcher is already gone
exits instead of running."""

import os
import signal
import socket
import subprocess
import sys
import time

from testlib import start_server

from rtp_llm.utils import procs

GONE_WITHIN_S = 30


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT connection is no listener
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def test_every_child_dies_with_a_launcher_killed_with_sigkill(smollm2):
    proc, base = start_server(smollm2, frontends=2)
    port = int(base.rsplit(":", 1)[1])
    children = procs.children(proc.pid)
    try:
        assert len(children) == 3, children  # one backend, two frontends
        assert all(procs.running(c) for c in children)
        assert not _port_free(port) and not _port_free(port + 1)  # HTTP and the backend's gRPC
    finally:
        proc.kill()
        proc.wait(timeout=30)
    try:
        deadline = time.monotonic() + GONE_WITHIN_S
        while time.monotonic() < deadline and any(procs.running(c) for c in children):
            time.sleep(0.2)
        assert not [c for c in children if procs.running(c)], "children outlived their launcher"
        while time.monotonic() < deadline and not (_port_free(port) and _port_free(port + 1)):
            time.sleep(0.2)
        assert _port_free(port) and _port_free(port + 1)
    finally:  # a failing run leaves nothing behind either
        for c in children:
            if procs.running(c):
                os.kill(c, signal.SIGKILL)


# The child's own view: PR_GET_PDEATHSIG (2) writes the signal it gets when its parent dies.
_PRINT_PDEATHSIG = ("import ctypes; s = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(s), 0, 0, 0); "
                    "print(s.value)")


def test_a_child_asks_for_sigkill_when_its_launcher_dies():
    from rtp_llm.start_server import dies_with_launcher

    out = subprocess.run([sys.executable, "-c", _PRINT_PDEATHSIG], preexec_fn=dies_with_launcher(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and int(out.stdout) == signal.SIGKILL, out
    plain = subprocess.run([sys.executable, "-c", _PRINT_PDEATHSIG], capture_output=True, text=True, timeout=60)
    assert int(plain.stdout) == 0  # (what the test would see without it)


def test_a_child_whose_launcher_is_already_gone_exits_instead_of_running():
    from rtp_llm.start_server import dies_with_launcher

    preexec = dies_with_launcher()  # its launcher: this process
    pid = os.fork()
    if pid == 0:  # another process starts a child with it: as if the launcher had died before prctl
        code = 99
        try:
            code = subprocess.Popen([sys.executable, "-c", "print('ran')"], preexec_fn=preexec).wait(timeout=60)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1  # the preexec_fn's exit, before the exec
