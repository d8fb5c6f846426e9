"""Checks that a built shared library resolves every symbol it imports, as the dynamic linker
will on the target machine, using the libraries it names as NEEDED.

  check_link.py --lib_dir DIR... [--python EXE] [--require SONAME]... [--forbid_runpath TEXT]... LIB

Each NEEDED entry is looked up in the --lib_dir directories (torch/lib, torch_npu/lib, the CANN
stubs), then in the system's library path. Every undefined, non-weak dynamic symbol of LIB
must be defined by one of those libraries (its direct NEEDED set, as `ld --no-undefined`
demands) or, with --python, exported by that interpreter (the C API an extension module
takes from the process that imports it). --require names SONAMEs that must be NEEDED;
--forbid_runpath, text that must not appear in RUNPATH/RPATH (build-tree paths).
Needs binutils (readelf, nm). Exits 1 with the unresolved symbols, demangled.
"""

import argparse
import os
import subprocess
import sys


def _run(args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def dynamic_section(lib):
    """(NEEDED sonames, RUNPATH/RPATH entries) of an ELF file."""
    needed, runpath = [], []
    for line in _run(["readelf", "-d", "-W", lib]).splitlines():
        if "(NEEDED)" in line or "(RUNPATH)" in line or "(RPATH)" in line:
            value = line.split("[", 1)[1].rsplit("]", 1)[0]
            if "(NEEDED)" in line:
                needed.append(value)
            else:
                runpath += value.split(":")
    return needed, runpath


def _symbols(lib, undefined):
    """Dynamic symbols of lib: undefined non-weak ones, or defined ones (names without version)."""
    flag = "--undefined-only" if undefined else "--defined-only"
    out = set()
    for line in _run(["nm", "-D", flag, lib]).splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        kind, name = parts[-2], parts[-1]
        if undefined and kind != "U":
            continue  # weak (w, v): allowed to stay unresolved
        out.add(name.split("@", 1)[0])
    return out


def _system_dirs():
    dirs = []
    try:
        for line in _run(["ldconfig", "-p"]).splitlines()[1:]:
            if "=>" in line:
                dirs.append(os.path.dirname(line.split("=>", 1)[1].strip()))
    except (OSError, subprocess.CalledProcessError):
        pass
    return list(dict.fromkeys(dirs + ["/lib64", "/usr/lib64", "/lib", "/usr/lib"]))


def _interpreter_libs(python):
    """The interpreter's executable and, when it is linked that way, its libpython."""
    exe = os.path.realpath(python)
    libs = [exe]
    for line in _run(["ldd", exe]).splitlines():
        if "libpython" in line and "=>" in line:
            libs.append(line.split("=>", 1)[1].split("(")[0].strip())
    return libs


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib_dir", action="append", default=[])
    p.add_argument("--python")
    p.add_argument("--require", action="append", default=[])
    p.add_argument("--forbid_runpath", action="append", default=[])
    p.add_argument("lib")
    args = p.parse_args(argv)

    errors = []
    needed, runpath = dynamic_section(args.lib)
    for soname in args.require:
        if soname not in needed:
            errors.append("%s is not NEEDED (NEEDED: %s)" % (soname, " ".join(needed)))
    for text in args.forbid_runpath:
        for entry in runpath:
            if text in entry:
                errors.append("RUNPATH entry %s points into %s" % (entry, text))

    search = args.lib_dir + _system_dirs()
    defined = set()
    for soname in needed:
        path = next((os.path.join(d, soname) for d in search if os.path.exists(os.path.join(d, soname))), None)
        if path is None:
            errors.append("NEEDED %s is in none of: %s" % (soname, " ".join(args.lib_dir) or "(no --lib_dir)"))
            continue
        defined |= _symbols(path, undefined=False)
    if args.python:
        for lib in _interpreter_libs(args.python):
            defined |= _symbols(lib, undefined=False)

    unresolved = sorted(_symbols(args.lib, undefined=True) - defined)
    if unresolved:
        demangled = _run(["c++filt"] + unresolved).split("\n") if unresolved else []
        errors.append("%d undefined symbols resolve against no NEEDED library%s:\n  %s" % (
            len(unresolved), "" if not args.python else " nor the interpreter", "\n  ".join(d for d in demangled if d)))
    for e in errors:
        sys.stderr.write("check_link: %s: %s\n" % (args.lib, e))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
