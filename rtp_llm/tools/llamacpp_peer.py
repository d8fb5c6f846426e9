"""llama.cpp as the peer of CPU benchmarks on the same GGUF file (issue 24): its `llama-bench`
(batch-1 prefill and decode) and `llama-batched-bench` (batch B, prefill included), built from
llama-cpp-python's source distribution on PyPI (which vendors llama.cpp; nothing from GitHub)
with native CPU flags, once, into ~/.cache/rtp_llm/llama.cpp/VERSION. A tool that prints
numbers, not a test; bench_offline --llamacpp runs it beside ours.

    python -m rtp_llm.tools.llamacpp_peer --gguf FILE [--threads 2] [--prompt_len 128] [--gen_len 128]
        [--batch 16] [--repeats 3]

Needs cmake, ninja and a C++ compiler (Debian: apt-get install cmake ninja-build g++; not part of
scripts/bootstrap.sh, since only this tool needs them); the first build takes 15-30 minutes on 2
cores."""

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass

VERSION = "0.3.36"  # llama-cpp-python's sdist; its vendor/llama.cpp is what is built
BINARIES = ("llama-bench", "llama-batched-bench")


@dataclass
class PeerNumbers:
    prefill_tps: float   # batch 1, prompt tokens/s
    decode_tps: float    # batch 1, generated tokens/s
    batch: int
    batch_out_tps: float  # batch `batch`: generated tokens / wall time, prefill included


def _log(msg: str):
    print(f"[llama.cpp peer] {msg}", file=sys.stderr, flush=True)


def build(cache: str = os.path.expanduser("~/.cache/rtp_llm/llama.cpp")) -> str:
    """The directory holding BINARIES, built first if needed."""
    root = os.path.join(cache, VERSION)
    bin_dir = os.path.join(root, "build", "bin")
    if all(os.path.exists(os.path.join(bin_dir, b)) for b in BINARIES):
        return bin_dir
    missing = [t for t in ("cmake", "ninja", "c++") if shutil.which(t) is None]
    if missing:
        raise SystemExit(f"building llama.cpp needs {', '.join(missing)}: apt-get install cmake ninja-build g++")
    os.makedirs(root, exist_ok=True)
    sdists = glob.glob(os.path.join(root, f"llama_cpp_python-{VERSION}.tar.gz"))
    if not sdists:
        _log(f"downloading llama-cpp-python {VERSION}'s source distribution from PyPI")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", root, f"llama-cpp-python=={VERSION}"], check=True)
        sdists = glob.glob(os.path.join(root, f"llama_cpp_python-{VERSION}.tar.gz"))
    src = os.path.join(root, "src")
    if not os.path.isdir(src):
        with tarfile.open(sdists[0]) as t:
            t.extractall(src, filter="data")
    llama = os.path.join(src, f"llama_cpp_python-{VERSION}", "vendor", "llama.cpp")
    build_dir = os.path.join(root, "build")
    _log(f"building {', '.join(BINARIES)} with native CPU flags (once; ~15 min on 2 cores)")
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
             "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
    subprocess.run(["cmake", "-S", llama, "-B", build_dir, "-G", "Ninja", *flags], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["ninja", "-C", build_dir, *BINARIES], check=True)
    return bin_dir


def _run(cmd, no_repack) -> str:
    """cmd's stdout. llama.cpp repacks weights for its fastest kernels by default; where that path
    crashes (its AMX kernels died with SIGSEGV on a 2-core VM with AMX), cmd again with
    `no_repack` (the tool's flag turning repacking off), said on stderr."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode == -signal.SIGSEGV:
        _log(f"{os.path.basename(cmd[0])} crashed with repacked weights (SIGSEGV); again with {' '.join(no_repack)}")
        out = subprocess.run(cmd + no_repack, capture_output=True, text=True)
    if out.returncode != 0:
        raise subprocess.CalledProcessError(out.returncode, cmd, out.stdout, out.stderr)
    return out.stdout


def batch1(bin_dir: str, gguf: str, threads: int, prompt_len: int, gen_len: int, repeats: int):
    """(prefill tok/s, decode tok/s) at batch 1: llama-bench's averages over `repeats` runs."""
    rows = json.loads(_run([os.path.join(bin_dir, "llama-bench"), "-m", gguf, "-t", str(threads),
                            "-p", str(prompt_len), "-n", str(gen_len), "-r", str(repeats), "-o", "json"],
                           ["--repack", "0"]))
    prefill = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
    decode = next(r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
    return float(prefill), float(decode)


def batched(bin_dir: str, gguf: str, threads: int, prompt_len: int, gen_len: int, batch: int) -> float:
    """Generated tokens/s of `batch` streams with their own prompts, over the wall time of prefill
    and decode (llama-batched-bench: pl streams, pp prompt and tg new tokens each)."""
    ctx = batch * (prompt_len + gen_len) + 64
    out = _run([os.path.join(bin_dir, "llama-batched-bench"), "-m", gguf, "-t", str(threads), "-tb", str(threads),
                "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(prompt_len), "-ntg", str(gen_len),
                "-npl", str(batch), "--output-format", "jsonl"], ["--no-repack"])
    row = next(json.loads(line) for line in out.splitlines() if line.startswith("{"))
    return row["pl"] * row["tg"] / row["t"]


def measure(gguf: str, threads: int, prompt_len: int, gen_len: int, batch: int, repeats: int) -> PeerNumbers:
    bin_dir = build()
    prefill, decode = batch1(bin_dir, gguf, threads, prompt_len, gen_len, repeats)
    return PeerNumbers(prefill, decode, batch, batched(bin_dir, gguf, threads, prompt_len, gen_len, batch))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", required=True)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--prompt_len", type=int, default=128)
    p.add_argument("--gen_len", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    print(measure(a.gguf, a.threads, a.prompt_len, a.gen_len, a.batch, a.repeats))


if __name__ == "__main__":
    main()
