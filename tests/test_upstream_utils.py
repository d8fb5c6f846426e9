"""Upstream's helpers for a server started as a subprocess, rtp_llm.utils.util: wait_sever_done
says when it is ready (or that it died first), stop_server stops it and all it started."""

import os
import subprocess
import sys

from testlib import free_port, server_argv

from rtp_llm.utils import procs
from rtp_llm.utils.util import stop_server, wait_sever_done


def test_wait_until_ready_then_stop_everything(smollm2):
    port = free_port()
    proc = subprocess.Popen(server_argv(smollm2, port, "--frontend_server_count=1", "--max_seq_len=128"))
    try:
        assert wait_sever_done(proc, port, timeout=300)
        children = procs.children(proc.pid)
        assert len(children) == 2  # a backend and a frontend
    finally:
        assert stop_server(proc)
    assert proc.returncode == 0  # a drained stop
    assert not [c for c in children if os.path.exists(f"/proc/{c}")]


def test_a_server_that_dies_first_is_not_waited_for(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "rtp_llm.start_server",
                             f"--checkpoint_path={tmp_path / 'missing'}", f"--start_port={free_port()}"])
    assert not wait_sever_done(proc, 1, timeout=300)
    assert proc.returncode == 2
    assert stop_server(proc)
