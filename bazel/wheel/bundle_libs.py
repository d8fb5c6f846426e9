"""Copies the shared libraries that the given ELF files load, minus the base system set that
every manylinux-compatible machine has, into one directory, and sets RPATH=$ORIGIN on each
copy so they find one another there (what `auditwheel repair` does). Needs ldd and patchelf.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

# The manylinux policy's base libraries: present on every compatible Linux, never bundled.
SYSTEM_LIBS = re.compile(
    r"^(linux-vdso|linux-gate|ld-linux.*|libc|libm|libdl|librt|libpthread|libutil|libnsl|"
    r"libresolv|libcrypt|libgcc_s|libstdc\+\+|libz)\.so(\.\d+)*$"
)
_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(\S+|not found)")


def ldd_closure(elf):
    out = subprocess.run(["ldd", elf], check=True, capture_output=True, text=True).stdout
    deps = {}
    for line in out.splitlines():
        m = _LDD_LINE.match(line)
        if not m:
            continue
        soname, path = m.groups()
        if path == "not found":
            raise SystemExit("bundle_libs: %s needs %s, which is not installed on this machine" % (elf, soname))
        deps[soname] = path
    return deps


def main(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out_dir", required=True)
    p.add_argument("elves", nargs="+")
    args = p.parse_args(argv)
    if shutil.which("patchelf") is None:
        raise SystemExit("bundle_libs: patchelf not found: apt-get install patchelf (scripts/bootstrap.sh does)")
    os.makedirs(args.out_dir, exist_ok=True)
    bundled = {}
    for elf in args.elves:
        for soname, path in ldd_closure(elf).items():
            if not SYSTEM_LIBS.match(soname):
                bundled[soname] = path
    for soname, path in sorted(bundled.items()):
        dest = os.path.join(args.out_dir, soname)
        shutil.copyfile(path, dest)
        os.chmod(dest, 0o755)
        subprocess.run(["patchelf", "--set-rpath", "$ORIGIN", dest], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
