"""llamacpp_peer's runs of llama.cpp's tools, on stand-ins that behave as llama.cpp did on an AMX
VM: a tool that dies with SIGSEGV on repacked weights is run again with repacking off (and that
is said); any other failure is raised, not retried."""

import json
import os
import stat
import subprocess
import tempfile
import textwrap
import unittest
from contextlib import redirect_stderr
from io import StringIO

from rtp_llm.tools import llamacpp_peer

# llama-bench's JSON: a prefill row and a decode row (averages in tokens/s).
ROWS = [{"n_prompt": 128, "n_gen": 0, "avg_ts": 300.0}, {"n_prompt": 0, "n_gen": 128, "avg_ts": 90.0}]


def stand_in(folder: str, body: str) -> str:
    """An executable llama-bench in `folder` running the Python `body` (argv in `args`)."""
    path = os.path.join(folder, "llama-bench")
    with open(path, "w") as f:
        f.write("#!/usr/bin/env python3\nimport json, os, signal, sys\nargs = sys.argv[1:]\n" + textwrap.dedent(body))
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


class LlamaCppPeerTest(unittest.TestCase):
    def test_a_crash_with_repacked_weights_runs_again_without(self):
        with tempfile.TemporaryDirectory() as d:
            stand_in(d, f"""
                if args[-2:] != ["--repack", "0"]:
                    os.kill(os.getpid(), signal.SIGSEGV)
                print(json.dumps({ROWS!r}))
                """)
            err = StringIO()
            with redirect_stderr(err):
                self.assertEqual(llamacpp_peer.batch1(d, "m.gguf", 2, 128, 128, 3), (300.0, 90.0))
            self.assertIn("crashed with repacked weights (SIGSEGV); again with --repack 0", err.getvalue())

    def test_a_run_that_works_is_not_repeated(self):
        with tempfile.TemporaryDirectory() as d:
            stand_in(d, f"""
                assert "--repack" not in args, args
                print(json.dumps({ROWS!r}))
                """)
            self.assertEqual(llamacpp_peer.batch1(d, "m.gguf", 2, 128, 128, 3), (300.0, 90.0))

    def test_other_failures_are_raised(self):
        with tempfile.TemporaryDirectory() as d:
            stand_in(d, """
                sys.stderr.write("error: failed to load model\\n")
                sys.exit(1)
                """)
            with self.assertRaises(subprocess.CalledProcessError) as e:
                llamacpp_peer.batch1(d, "m.gguf", 2, 128, 128, 3)
            self.assertIn("failed to load model", e.exception.stderr)


if __name__ == "__main__":
    unittest.main()
