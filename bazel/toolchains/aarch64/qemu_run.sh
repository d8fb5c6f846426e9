#!/bin/sh
# Runs an aarch64 ELF test under qemu-user (no binfmt needed); anything else (a Python or
# shell test) is executed directly. The guest's loader and libc come from the cross
# toolchain's sysroot (libc6-arm64-cross), other libraries from the multiarch directory
# (libgrpc++-dev:arm64). The sysroot's libc must come first: mixing its loader with the
# multiarch libc (a different build) hangs threaded programs.
set -e
machine=$(od -An -j18 -N2 -tx1 "$1" 2>/dev/null | tr -d ' ')
if [ "$(head -c4 "$1" | od -An -c | tr -d ' ')" = "177ELF" ] && [ "$machine" = "b700" ]; then
    for q in qemu-aarch64-static qemu-aarch64; do
        if command -v "$q" >/dev/null 2>&1; then
            exec "$q" -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib:/usr/lib/aarch64-linux-gnu "$@"
        fi
    done
    echo "qemu_run: qemu-aarch64 not found: apt-get install qemu-user-static (scripts/bootstrap.sh does)" >&2
    exit 1
fi
exec "$@"
