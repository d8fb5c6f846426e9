#!/usr/bin/env bash
# Builds the Ascend wheel (`bazelisk build --config=ascend //rtp_llm:rtp_llm_whl`) on any
# x86_64 or aarch64 machine, NPU or not, and checks it. The Ascend wheel is the package built
# against the torch that torch_npu needs (its compute-ops extension: the CPU kernels, linked
# with that torch) and requiring the pinned torch and torch_npu; the NPU backend calls
# torch_npu's ops from Python (docs/ascend.md). Idempotent: a second run reuses the
# environment and Bazel's cache.
#
#   scripts/build_ascend.sh [--shutdown]
#
#  1. A build-only Python environment, $CACHE/ascend-venv, with the torch that
#     deps/requirements_ascend.txt pins (installed --no-deps: the x86_64 PyPI torch is the CUDA
#     build, whose nvidia-* packages linking does not need) and deps/requirements_build.txt.
#     Wheels are kept in $CACHE/ascend-wheels. Nothing in it imports torch; the build only
#     reads files.
#  2. The build, with its own Bazel output base ($CACHE/bazel-ascend/<checkout>) and no
#     convenience links, so the default build's cache and bazel-* links stay as they are
#     (links into a second output base would also put its copy of the tree under `//...`).
#     The wheel is copied to $CACHE/ascend-dist/.
#  3. Checks, printed: the wheel's Requires-Dist (the pinned torch and torch_npu), the
#     extension's NEEDED and RUNPATH, that every symbol it imports resolves against torch or
#     the interpreter (3rdparty/torch_npu/check_link.py), and that the wheel bundles no torch,
#     torch_npu or CANN library.
# --shutdown stops this output base's Bazel server afterwards (CI: frees its memory).
# Environment: RTP_LLM_CACHE (default ~/.cache/rtp_llm); PYTHON, an interpreter that torch_npu
# has wheels for (CPython 3.10 or 3.11; default: the first of python3, python3.11, python3.10).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SHUTDOWN=0
for arg in "$@"; do
  case "$arg" in
    --shutdown) SHUTDOWN=1 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "build_ascend: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

CACHE=${RTP_LLM_CACHE:-$HOME/.cache/rtp_llm}
VENV=$CACHE/ascend-venv
WHEELS=$CACHE/ascend-wheels
# One output base per checkout (as Bazel's own default): an output base serves one workspace.
OUTPUT_BASE=$CACHE/bazel-ascend/$(printf '%s' "$ROOT" | md5sum | cut -c1-12)
REQS=deps/requirements_ascend.txt
log() { printf '[build_ascend] %s\n' "$*"; }
die() { printf 'build_ascend: %s\n' "$*" >&2; exit 1; }

pin() {  # the version `$1==X` in $REQS
  local v
  v=$(sed -n "s/^$1==\([^ #]*\).*/\1/p" "$REQS")
  [ -n "$v" ] || die "$REQS does not pin $1 (expected a line '$1==<version>')"
  echo "$v"
}
TORCH_VERSION=$(pin torch)
TORCH_NPU_VERSION=$(pin torch_npu)

# --- Python ------------------------------------------------------------------------------
supported() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 10), (3, 11)))' 2>/dev/null; }
if [ -n "${PYTHON:-}" ]; then
  supported "$PYTHON" || die "PYTHON=$PYTHON is not CPython 3.10 or 3.11, the versions torch_npu $TORCH_NPU_VERSION has wheels for"
else
  for cand in python3 python3.11 python3.10; do
    if command -v "$cand" >/dev/null && supported "$cand"; then PYTHON=$cand; break; fi
  done
  [ -n "${PYTHON:-}" ] || die "no CPython 3.10 or 3.11 found (torch_npu $TORCH_NPU_VERSION has wheels for those only): install one (Debian 12: python3.11, python3.11-dev, python3.11-venv) or set PYTHON=/path/to/python3.11"
fi

STAMP="$VENV/.rtp_llm_ascend"
WANT=$(cat "$REQS" deps/requirements_build.txt | sha256sum | cut -c1-16)-$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-$(uname -m)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  log "creating $VENV (torch==$TORCH_VERSION, build tools)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  mkdir -p "$WHEELS"
  pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
  retry() {  # pip retries connections itself; this covers a download cut short
    local attempt
    for attempt in 1 2 3; do
      "$@" && return 0
      log "attempt $attempt failed: $*"
      sleep $((attempt * 10))
    done
    return 1
  }
  retry pip install -q --retries 5 -r deps/requirements_build.txt \
    || die "installing deps/requirements_build.txt (grpcio-tools: the build's proto code generator) failed"
  # pip picks the host's wheels (manylinux x86_64 or aarch64); an already downloaded file is
  # reused. torch from PyPI: torch_npu's own requirement, torch==X+cpu, lives on PyTorch's
  # index, and its libraries are ABI-identical for linking.
  retry pip download --no-deps --retries 5 --progress-bar off --dest "$WHEELS" "torch==$TORCH_VERSION" \
    || die "downloading torch==$TORCH_VERSION from PyPI failed (see pip's message above; a proxy needs HTTPS_PROXY)"
  # --no-warn-conflicts: torch's nvidia-* requirements are left out on purpose.
  pip install -q --no-deps --no-warn-conflicts --no-index --find-links "$WHEELS" "torch==$TORCH_VERSION" \
    || die "installing the downloaded wheels from $WHEELS failed (delete that directory to download them again)"
  echo "$WANT" > "$STAMP"
else
  log "Python environment: up to date ($VENV)"
fi
PYTHON_BIN=$VENV/bin/python

# --- build -------------------------------------------------------------------------------
command -v bazelisk >/dev/null || die "bazelisk not found: run scripts/bootstrap.sh"
# Nothing here imports torch; should anything where torch_npu is installed, its autoload must
# not run without CANN.
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
BAZEL=(bazelisk --output_base="$OUTPUT_BASE")
log "bazelisk build --config=ascend //rtp_llm:rtp_llm_whl (output base $OUTPUT_BASE)"
start=$SECONDS
"${BAZEL[@]}" build --config=ascend --symlink_prefix=/ \
  --repo_env=PYTHON_BIN_PATH="$PYTHON_BIN" //rtp_llm:rtp_llm_whl
log "build took $((SECONDS - start)) s"

# --- checks ------------------------------------------------------------------------------
BIN=$("${BAZEL[@]}" info --config=ascend bazel-bin 2>/dev/null)
WHEEL=$(ls "$BIN"/rtp_llm/rtp_llm-*.whl)
[ "$(echo "$WHEEL" | wc -l)" = 1 ] || die "expected one wheel in $BIN/rtp_llm/, found: $WHEEL"
SITE=$("$PYTHON_BIN" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
UNPACKED=$(mktemp -d)
trap 'rm -rf "$UNPACKED"' EXIT
"$PYTHON_BIN" - "$WHEEL" "$UNPACKED" "$TORCH_VERSION" "$TORCH_NPU_VERSION" <<'EOF'
import re, sys, zipfile
wheel, dest, torch, torch_npu = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf:
    names = zf.namelist()
    meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    zf.extract("rtp_llm/libs/librtp_compute_ops.so", dest)
requires = [l for l in meta.splitlines() if l.startswith("Requires-Dist:")]
print("Requires-Dist of %s:" % wheel)
print("\n".join("  " + r for r in requires))
for pin in ("torch==" + torch, "torch_npu==" + torch_npu):
    if "Requires-Dist: " + pin not in requires:
        sys.exit("build_ascend: the wheel does not require %s" % pin)
foreign = [n for n in names if re.search(r"/lib(torch|c10|ascendcl|hccl|acl_|ge_runner|graph)[^/]*\.so", n)]
if foreign:
    sys.exit("build_ascend: the wheel bundles torch/torch_npu/CANN libraries: %s" % foreign)
EOF
SO=$UNPACKED/rtp_llm/libs/librtp_compute_ops.so
echo "librtp_compute_ops.so, readelf -d:"
readelf -d "$SO" | grep -E '\((NEEDED|RUNPATH|RPATH)\)' | sed 's/^ */  /'
"$PYTHON_BIN" 3rdparty/torch_npu/check_link.py \
  --lib_dir "$SITE/torch/lib" --python "$PYTHON_BIN" \
  --forbid_runpath _solib --forbid_runpath "$OUTPUT_BASE" "$SO" \
  || die "the extension imports symbols nothing provides (above): see 3rdparty/torch_npu/check_link.py"
log "link check passed: every imported symbol resolves against torch or the interpreter"
DIST=$CACHE/ascend-dist
rm -rf "$DIST" && mkdir -p "$DIST" && cp "$WHEEL" "$DIST/"
log "wheel: $DIST/$(basename "$WHEEL")"
if [ "$SHUTDOWN" = 1 ]; then
  "${BAZEL[@]}" shutdown
fi
