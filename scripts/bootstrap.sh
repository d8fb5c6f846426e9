#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine (x86_64 or aarch64) to build and test rtp_llm, offline
# from then on. Idempotent: a second run only checks. Run as root or with sudo available.
#
#   scripts/bootstrap.sh [--device=cpu|cuda|ascend] [--relock]
#
# Installs: Debian packages (Bazel 4 + rules, C++ toolchain, gRPC/protobuf, GoogleTest,
# patchelf; on x86_64 also the aarch64 cross compiler, qemu-user and arm64 gRPC libraries),
# bazelisk from npm, and a Python virtual environment (.venv) with the pinned requirements
# from deps/. Writes the machine-specific settings to git-ignored files: .bazeliskrc (the
# local Bazel for bazelisk) and .bazelrc.user (PYTHON_BIN_PATH, sandbox base).
# --relock rewrites deps/requirements_<device>_<arch>.lock from the resulting venv.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVICE=cpu
RELOCK=0
for arg in "$@"; do
  case "$arg" in
    --device=*) DEVICE=${arg#--device=} ;;
    --relock) RELOCK=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "bootstrap: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cpu|cuda|ascend) ;; *) echo "bootstrap: --device must be cpu, cuda or ascend, not '$DEVICE'" >&2; exit 2 ;; esac

BAZELISK_VERSION=1.28.1
TOOLS_DIR=/usr/local/lib/rtp_llm
VENV="$ROOT/.venv"
PYTHON=${PYTHON:-python3}

log() { printf '[bootstrap] %s\n' "$*"; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "bootstrap: run as root or install sudo" >&2; exit 1; }
  SUDO=sudo
fi

case "$(uname -m)" in
  x86_64) ARCH=x86_64; DEB_ARCH=amd64 ;;
  aarch64|arm64) ARCH=aarch64; DEB_ARCH=arm64 ;;
  *) echo "bootstrap: unsupported machine $(uname -m) (x86_64 and aarch64 are)" >&2; exit 1 ;;
esac

# --- Debian packages -------------------------------------------------------------------
PACKAGES=(bazel-bootstrap bazel-rules-java bazel-platforms googletest gcc g++ binutils
          libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler pkg-config
          patchelf)
if [ "$ARCH" = x86_64 ]; then
  # Cross toolchain and the arm64 libraries the cross build links (Multi-Arch: same).
  PACKAGES+=(g++-aarch64-linux-gnu qemu-user-static libgrpc++-dev:arm64 libprotobuf-dev:arm64)
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    log "enabling the arm64 package architecture"
    $SUDO dpkg --add-architecture arm64
    NEED_UPDATE=1
  fi
fi
if ! "$PYTHON" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null \
   || ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
  PACKAGES+=(python3 python3-dev python3-venv)
fi

# npm ships with Debian's npm package or inside other Node.js builds (e.g. nodesource's):
# only ask for it when there is none.
command -v npm >/dev/null || PACKAGES+=(nodejs npm)

installed() {  # pkg[:arch]; an unqualified name means the native or the `all` architecture
  case "$1" in
    *:*) [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ] ;;
    *) [ "$(dpkg-query -W -f='${Status}' "$1:$DEB_ARCH" 2>/dev/null)" = "install ok installed" ] ||
       [ "$(dpkg-query -W -f='${Status} ${Architecture}' "$1" 2>/dev/null)" = "install ok installed all" ] ;;
  esac
}
missing=()
for pkg in "${PACKAGES[@]}"; do
  installed "$pkg" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -q
  # One transaction for every package (native and arm64 together), so apt cannot resolve a
  # conflict by removing the compiler or Bazel.
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
else
  log "Debian packages: all present"
fi

# --- bazelisk (npm) --------------------------------------------------------------------
BAZELISK_BIN="$TOOLS_DIR/bazelisk/node_modules/@bazel/bazelisk/bazelisk-linux_$DEB_ARCH"
if [ ! -x "$BAZELISK_BIN" ]; then
  log "installing bazelisk $BAZELISK_VERSION from npm"
  # --prefix: a global install would clash with Debian's /usr/bin/bazel.
  $SUDO npm install --silent --no-audit --no-fund --prefix "$TOOLS_DIR/bazelisk" "@bazel/bazelisk@$BAZELISK_VERSION"
fi
if [ "$(readlink -f /usr/local/bin/bazelisk 2>/dev/null)" != "$(readlink -f "$BAZELISK_BIN")" ]; then
  $SUDO ln -sf "$BAZELISK_BIN" /usr/local/bin/bazelisk
fi

# --- Python virtual environment --------------------------------------------------------
LOCK="$ROOT/deps/requirements_${DEVICE}_${ARCH}.lock"
if [ -f "$LOCK" ]; then
  REQS=(-r "$LOCK")
else
  REQS=(-r "$ROOT/deps/requirements_${DEVICE}.txt" -r "$ROOT/deps/requirements_build.txt")
fi
STAMP="$VENV/.rtp_llm_requirements"
WANT=$(cat "${REQS[@]:1:1}" "$ROOT"/deps/requirements_*.txt | sha256sum | cut -c1-16)-$DEVICE
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  log "installing Python requirements (${REQS[*]#"$ROOT/"})"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "${REQS[@]}"
  echo "$WANT" > "$STAMP"
else
  log "Python requirements: up to date"
fi
if [ "$RELOCK" = 1 ]; then
  {
    echo "# pip freeze of a venv made by scripts/bootstrap.sh --device=$DEVICE on $ARCH (Python $("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])'))."
    echo "# Regenerate with \`scripts/bootstrap.sh --relock\` after changing requirements_$DEVICE.txt or requirements_build.txt."
    "$VENV/bin/python" -m pip freeze --all | grep -v -E '^pip==' | sed -E 's/^(torch==[^+]*)\+.*$/\1/'
  } > "$LOCK"
  log "wrote ${LOCK#"$ROOT/"}"
fi

# --- machine-specific Bazel settings (git-ignored) -------------------------------------
BAZEL_BIN=$(command -v bazel-4 || true)
[ -n "$BAZEL_BIN" ] || { echo "bootstrap: bazel-4 not found after installing bazel-bootstrap" >&2; exit 1; }
# An absolute path makes bazelisk run that Bazel instead of downloading one.
echo "USE_BAZEL_VERSION=$BAZEL_BIN" > "$ROOT/.bazeliskrc"
{
  echo "# Written by scripts/bootstrap.sh for this machine; not committed."
  echo "build --repo_env=PYTHON_BIN_PATH=$VENV/bin/python"
  # Sandboxing ~9k torch headers is ~30x faster on tmpfs.
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then echo "build --sandbox_base=/dev/shm"; fi
} > "$ROOT/.bazelrc.user.new"
if ! cmp -s "$ROOT/.bazelrc.user.new" "$ROOT/.bazelrc.user"; then
  mv "$ROOT/.bazelrc.user.new" "$ROOT/.bazelrc.user"
  log "wrote .bazelrc.user and .bazeliskrc"
else
  rm "$ROOT/.bazelrc.user.new"
fi
log "ready ($ARCH, device=$DEVICE): bazelisk build //rtp_llm:rtp_llm_whl"
