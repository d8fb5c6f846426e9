#!/usr/bin/env bash
# Acceptance checks of the installed wheel, run from outside the source tree:
#  1. the core loads (OPS_LOAD_OK), the compute ops load, the generated stubs import;
#  2. portability: with every system library that the wheel bundles hidden (bind-mounted
#     over with /dev/null in a private mount namespace, as on a machine without Debian's
#     gRPC runtime packages), `ldd` finds every dependency of every .so in the wheel
#     inside the wheel, and (1) still passes. Where no mount namespace can be made (not
#     root), the same checks run without hiding, with a warning.
#
#   scripts/check_wheel.sh [VENV]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=$("$ROOT/scripts/install_wheel.sh" "$@" | tail -n 1)
cd /tmp

SMOKE='
from rtp_llm.ops import ensure_engine_ops_loaded, ensure_compute_ops_loaded, engine_build_info
ensure_engine_ops_loaded()
print("OPS_LOAD_OK", engine_build_info())
ensure_compute_ops_loaded()
from rtp_llm.cpp.model_rpc.proto import model_rpc_service_pb2, model_rpc_service_pb2_grpc
print("PB2_IMPORT_OK", model_rpc_service_pb2.GenerateInputPB.DESCRIPTOR.full_name)
'
"$PY" -c "$SMOKE"

LIBS=$("$PY" -c 'import rtp_llm.ops as o; print(o.libs_dir().resolve())')
# System copies of what the wheel bundles: the files a fresh machine would not have.
hidden=()
for lib in "$LIBS"/*.so*; do
  name=$(basename "$lib")
  for dir in "/usr/lib/$(uname -m)-linux-gnu" "/lib/$(uname -m)-linux-gnu"; do
    for f in "$dir/$name" "$dir/$name".*; do
      [ -e "$f" ] && hidden+=("$(readlink -f "$f")")
    done
  done
done
mapfile -t hidden < <(printf '%s\n' "${hidden[@]}" | sort -u)
echo "[check_wheel] hiding ${#hidden[@]} system libraries the wheel bundles (e.g. $(basename "${hidden[0]}"))"

HIDE='for f in "$@"; do mount --bind /dev/null "$f"; done'
CHECK='
set -e
bad=0
for so in '"$LIBS"'/*.so*; do
  out=$(ldd "$so")
  if echo "$out" | grep -q "not found"; then echo "$so:"; echo "$out" | grep "not found"; bad=1; fi
  # Every non-system dependency must resolve inside the wheel.
  if echo "$out" | grep -E "=> /usr/lib|=> /lib" | grep -v -E "/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|libz)\.so"; then
    echo "$so resolves the above outside the wheel"; bad=1
  fi
done
[ $bad = 0 ] || exit 1
echo "LDD_OK: no \"not found\" and nothing outside the wheel for $(ls '"$LIBS"'/*.so* | wc -l) libraries"
'"$PY"' -c '"'$SMOKE'"'
'
if unshare --mount --propagation private true 2>/dev/null; then
  unshare --mount --propagation private bash -c "$HIDE
$CHECK" check "${hidden[@]}"
else
  # Without a mount namespace (no root/CAP_SYS_ADMIN) the system copies stay visible; the
  # resolution check below still requires every bundled dependency to come from the wheel.
  echo "[check_wheel] WARNING: cannot create a mount namespace here: checking without hiding system libraries" >&2
  bash -c "$CHECK" check
fi
