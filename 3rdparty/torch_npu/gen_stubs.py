"""Writes the C source of a link-only stub of a CANN shared library: one function symbol for
every C-linkage function that the given headers declare, and nothing else.

The stub lets a torch_npu extension link with -Wl,--no-undefined on a machine without CANN:
the linker sees that each ACL/HCCL function the extension calls is defined by the library
(and records its SONAME as NEEDED), while the real library, found at run time through CANN's
set_env.sh, provides the code. The stub is never loaded; should it be, every function traps.

Only declarations with C linkage are taken (inside `extern "C" { ... }` or `extern "C" decl;`),
so C++ declarations in the same headers (GE's classes, namespaced functions) are left out:
their mangled names cannot be derived without a C++ front end.

  gen_stubs.py --soname libascendcl.so --out stub.c HEADER...
"""

import argparse
import os
import re
import sys

_IDENT = re.compile(r"[A-Za-z_]\w*")
_KEYWORDS = {"if", "while", "for", "switch", "return", "sizeof", "typedef", "static", "inline"}


def strip_comments_and_directives(text):
    """The header without comments, string/char literal contents and preprocessor lines."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if at_line_start and c == "#":
            # A directive runs to the end of the line, continued by a trailing backslash.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    i += 2
                    continue
                if text.startswith("/*", i):  # a block comment may span the directive's end
                    end = text.find("*/", i + 2)
                    i = n if end < 0 else end + 2
                    continue
                i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + "s" + c)  # keeps `extern "C"` recognizable ("s"), drops the contents
            if text[i + 1:j] == "C":
                out[-1] = '"C"'
            i = j + 1
            continue
        if c == "\n":
            at_line_start = True
        out.append(c)
        i += 1
    return "".join(out)


def _drop_balanced(stmt, opener):
    """stmt without each `opener(...)` (balanced parentheses), e.g. __attribute__((...))."""
    while True:
        m = re.search(r"\b%s\s*\(" % re.escape(opener), stmt)
        if not m:
            return stmt
        depth, j = 0, m.end() - 1
        while j < len(stmt):
            depth += {"(": 1, ")": -1}.get(stmt[j], 0)
            j += 1
            if depth == 0:
                break
        stmt = stmt[:m.start()] + " " + stmt[j:]


def function_name(stmt):
    """The name a C function declaration declares, or None (types, variables, pointers)."""
    stmt = " ".join(stmt.split())
    for attr in ("__attribute__", "__declspec", "_declspec", "ACL_DEPRECATED_MESSAGE"):
        stmt = _drop_balanced(stmt, attr)
    stmt = stmt.strip()
    if not stmt.endswith(")") or re.match(r"(typedef|static|inline|using|template)\b", stmt):
        return None
    depth, j = 0, len(stmt) - 1
    while j >= 0:
        depth += {")": 1, "(": -1}.get(stmt[j], 0)
        if depth == 0:
            break
        j -= 1
    head = stmt[:j].rstrip()
    m = re.search(r"([A-Za-z_]\w*)$", head)
    if not m or m.group(1) in _KEYWORDS:
        return None
    before = head[:m.start()]
    if not _IDENT.search(before.replace('extern "C"', "")):
        return None  # no return type: a macro invocation, not a declaration
    if "(" in before or "::" in head or "operator" in head:
        return None
    return m.group(1)


def c_functions(text):
    """Names of the C-linkage functions declared at file scope (or in extern "C" blocks)."""
    text = strip_comments_and_directives(text)
    names = []
    stack = []  # "C" (extern "C" block), "ns" (namespace): scopes whose declarations count
    stmt = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "{":
            head = " ".join("".join(stmt).split())
            if head.endswith('extern "C"'):
                stack.append("C")
                stmt = []
            elif re.match(r"^(inline\s+)?namespace\b", head):
                stack.append("ns")
                stmt = []
            else:
                # A body (struct, enum, union, class, function, initializer): skip it; a
                # declaration that had a body defines something, so it is not collected.
                depth = 0
                while i < n:
                    depth += {"{": 1, "}": -1}.get(text[i], 0)
                    i += 1
                    if depth == 0:
                        break
                # A function definition ends at its body; a struct/enum body is followed by
                # the rest of its declaration up to `;`.
                is_function = re.search(r"\)\s*(const|noexcept|override|\s)*$", head)
                stmt = [] if is_function else ["{body}"]
                continue
        elif c == "}":
            if stack:
                stack.pop()
            stmt = []
        elif c == ";":
            decl = "".join(stmt)
            c_linkage = (stack and stack[-1] == "C") or decl.lstrip().startswith('extern "C"')
            if "{body}" not in decl and c_linkage:
                name = function_name(decl)
                if name:
                    names.append(name)
            stmt = []
        else:
            stmt.append(c)
        i += 1
    return names


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--soname", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("headers", nargs="+")
    args = p.parse_args(argv)
    names = {}
    for header in args.headers:
        with open(header, encoding="utf-8", errors="replace") as f:
            for name in c_functions(f.read()):
                names.setdefault(name, header)
    if not names:
        sys.stderr.write("gen_stubs: no C functions found in %s\n" % " ".join(args.headers))
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("/* Link-only stub of %s (%d functions), generated by gen_stubs.py. Never loaded. */\n" % (args.soname, len(names)))
        for name in sorted(names):
            f.write("void %s(void) { __builtin_trap(); }\n" % name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
