"""Writes a wheel (PEP 427): the given files, METADATA, WHEEL and a RECORD with hashes.

Requires-Dist comes from a requirements file (with -r includes), after checking that it pins
exactly the versions the binaries were built against and allows nothing older than the
generated code accepts, so one file cannot say one version while the build used another.
Entries are sorted and time-stamped 1980-01-01: the same inputs give the same bytes."""

import argparse
import base64
import hashlib
import os
import re
import stat
import sys
import zipfile

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*(;.*)?$")
_SPEC = re.compile(r"(==|>=|<=|~=|!=|<|>)\s*([A-Za-z0-9.+*]+)")
_EPOCH = (1980, 1, 1, 0, 0, 0)


class RequirementError(Exception):
    pass


def _norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _version_tuple(version):
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0]))


def read_requirements(path, seen=None):
    """[(name, specifiers, full line, 'file:line')] from a pip requirements file."""
    seen = seen or set()
    if path in seen:
        return []
    seen.add(path)
    out = []
    with open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith(("-r ", "--requirement ")):
                include = line.split(None, 1)[1].strip()
                out += read_requirements(os.path.join(os.path.dirname(path), include), seen)
                continue
            if line.startswith("-"):
                continue  # pip options (index urls, ...) are not wheel metadata
            m = _REQ.match(line)
            if not m:
                raise RequirementError("%s:%d: cannot parse requirement %r" % (path, lineno, line))
            out.append((_norm(m.group(1)), _SPEC.findall(m.group(3)), line, "%s:%d" % (path, lineno)))
    return out


def check_requirements(reqs, built_against, minimums, path):
    by_name = {name: (specs, line, where) for name, specs, line, where in reqs}
    for pkg, version in built_against.items():
        if pkg not in by_name:
            raise RequirementError("%s does not list %s, but the binaries were built against %s %s: add `%s==%s`." % (path, pkg, pkg, version, pkg, version))
        specs, line, where = by_name[pkg]
        if specs != [("==", version)]:
            raise RequirementError("%s says `%s`, but the binaries were built against %s %s (the configured PYTHON_BIN_PATH's). Pin `%s==%s` there, or build with an interpreter that has the pinned version (scripts/bootstrap.sh --device=...)." % (where, line, pkg, version, pkg, version))
    for pkg, floor in minimums.items():
        if pkg not in by_name:
            raise RequirementError("%s does not list %s; the generated code needs %s>=%s." % (path, pkg, pkg, floor))
        specs, line, where = by_name[pkg]
        lows = [v for op, v in specs if op in (">=", "==", "~=")]
        if not lows or max(_version_tuple(v) for v in lows) < _version_tuple(floor):
            raise RequirementError("%s says `%s`, but the generated code needs %s>=%s (grpcio-tools of the build)." % (where, line, pkg, floor))


def _record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _add(zf, record, arcname, data, executable=False):
    info = zipfile.ZipInfo(arcname, date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
    zf.writestr(info, data)
    record.append("%s,%s,%d" % (arcname, _record_hash(data), len(data)))


def build_wheel(args):
    files = {}
    for spec in args.file:
        dest, src = spec.split("=", 1)
        files[dest] = src
    for spec in args.tree:
        dest_dir, src_dir = spec.split("=", 1)
        for entry in sorted(os.listdir(src_dir)):
            files["%s/%s" % (dest_dir, entry)] = os.path.join(src_dir, entry)

    # As Bazel's runfiles do (legacy_create_init): every directory holding Python is a package.
    for dest in [d for d in files if d.endswith(".py")]:
        parent = os.path.dirname(dest)
        while parent:
            files.setdefault(parent + "/__init__.py", os.devnull)
            parent = os.path.dirname(parent)

    reqs = read_requirements(args.requirements)
    check_requirements(
        reqs,
        {_norm(k): v for k, v in (s.split("=", 1) for s in args.built_against)},
        {_norm(k): v for k, v in (s.split("=", 1) for s in args.minimum) if v},
        args.requirements,
    )

    dist_info = "%s-%s.dist-info" % (args.distribution, args.version)
    metadata = ["Metadata-Version: 2.1", "Name: " + args.distribution, "Version: " + args.version]
    if args.summary:
        metadata.append("Summary: " + args.summary)
    if args.python_requires:
        metadata.append("Requires-Python: " + args.python_requires)
    metadata += ["Requires-Dist: " + line for _, _, line, _ in reqs]
    wheel = ["Wheel-Version: 1.0", "Generator: rtp_llm bazel/wheel/wheelmaker.py", "Root-Is-Purelib: false", "Tag: " + args.tag]

    record = []
    with zipfile.ZipFile(args.out, "w") as zf:
        for dest in sorted(files):
            with open(files[dest], "rb") as f:
                data = f.read()
            _add(zf, record, dest, data, executable=dest.endswith(".so"))
        _add(zf, record, dist_info + "/METADATA", ("\n".join(metadata) + "\n").encode())
        _add(zf, record, dist_info + "/WHEEL", ("\n".join(wheel) + "\n").encode())
        record.append(dist_info + "/RECORD,,")
        info = zipfile.ZipInfo(dist_info + "/RECORD", date_time=_EPOCH)
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, "\n".join(record) + "\n")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--distribution", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--tag", required=True, help="python-abi-platform")
    p.add_argument("--summary", default="")
    p.add_argument("--python_requires", default="")
    p.add_argument("--requirements", required=True)
    p.add_argument("--built_against", action="append", default=[], metavar="PKG=VERSION")
    p.add_argument("--minimum", action="append", default=[], metavar="PKG=VERSION")
    p.add_argument("--file", action="append", default=[], metavar="DEST=SRC")
    p.add_argument("--tree", action="append", default=[], metavar="DEST_DIR=SRC_DIR")
    args = p.parse_args(argv)
    try:
        build_wheel(args)
    except RequirementError as e:
        sys.stderr.write("wheelmaker: %s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
