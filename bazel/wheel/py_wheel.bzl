"""Local stand-in for rules_python's `py_wheel` (same attribute names where they overlap),
plus `bundled_shared_libs`, which does what auditwheel's repair does for our libraries."""

def _py_wheel_impl(ctx):
    whl = ctx.actions.declare_file("%s-%s-%s-%s-%s.whl" % (
        ctx.attr.distribution,
        ctx.attr.version,
        ctx.attr.python_tag,
        ctx.attr.abi,
        ctx.attr.platform,
    ))
    sources = depset(transitive = [dep[PyInfo].transitive_sources for dep in ctx.attr.deps])
    libs = ctx.files.libs + ctx.files.bundled_libs

    args = ctx.actions.args()
    args.add(ctx.file._wheelmaker)
    args.add("--out", whl)
    args.add("--distribution", ctx.attr.distribution)
    args.add("--version", ctx.attr.version)
    args.add("--tag", "%s-%s-%s" % (ctx.attr.python_tag, ctx.attr.abi, ctx.attr.platform))
    args.add("--summary", ctx.attr.summary)
    args.add("--python_requires", ctx.attr.python_requires)
    args.add("--requirements", ctx.file.requirements)
    for pkg, version in ctx.attr.built_against.items():
        args.add("--built_against", "%s=%s" % (pkg, version))
    for pkg, floor in ctx.attr.minimum_versions.items():
        args.add("--minimum", "%s=%s" % (pkg, floor))
    for src in sources.to_list():
        if not src.short_path.startswith("../"):  # external repositories are not ours to ship
            args.add("--file", "%s=%s" % (src.short_path, src.path))
    for lib in ctx.files.libs:
        args.add("--file", "%s/%s=%s" % (ctx.attr.libs_dir, lib.basename, lib.path))
    for tree in ctx.files.bundled_libs:
        args.add("--tree", "%s=%s" % (ctx.attr.libs_dir, tree.path))

    ctx.actions.run(
        executable = ctx.executable._python,
        arguments = [args],
        inputs = depset([ctx.file._wheelmaker, ctx.file.requirements] + ctx.files.requirement_includes + libs, transitive = [sources]),
        outputs = [whl],
        mnemonic = "PyWheel",
        progress_message = "Packing wheel %s" % whl.short_path,
    )
    return [DefaultInfo(files = depset([whl]), runfiles = ctx.runfiles(files = [whl]))]

py_wheel = rule(
    implementation = _py_wheel_impl,
    attrs = {
        "distribution": attr.string(mandatory = True),
        "version": attr.string(mandatory = True),
        "python_tag": attr.string(mandatory = True),
        "abi": attr.string(default = "none"),
        "platform": attr.string(default = "any"),
        "summary": attr.string(default = ""),
        "python_requires": attr.string(default = ""),
        "deps": attr.label_list(providers = [PyInfo], doc = "py_library targets whose transitive sources are packed at their workspace paths."),
        "libs": attr.label_list(allow_files = [".so"], doc = "Shared libraries packed into libs_dir."),
        "bundled_libs": attr.label_list(allow_files = True, doc = "bundled_shared_libs directories packed into libs_dir."),
        "libs_dir": attr.string(default = "libs"),
        "requirements": attr.label(allow_single_file = True, mandatory = True, doc = "Requires-Dist source (deps/requirements_<device>.txt)."),
        "requirement_includes": attr.label_list(allow_files = True, doc = "Files that `requirements` includes with -r."),
        "built_against": attr.string_dict(doc = "package -> version compiled against; `requirements` must pin exactly that."),
        "minimum_versions": attr.string_dict(doc = "package -> lowest version the generated code accepts; `requirements` must not allow lower."),
        "_python": attr.label(default = "@local_config_python//:python3", executable = True, cfg = "exec"),
        "_wheelmaker": attr.label(default = "//bazel/wheel:wheelmaker.py", allow_single_file = True),
    },
)

def _bundled_shared_libs_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    args = ctx.actions.args()
    args.add(ctx.file._bundle_libs)
    args.add("--out_dir", out.path)
    args.add_all(ctx.files.srcs)
    ctx.actions.run(
        executable = ctx.executable._python,
        arguments = [args],
        inputs = ctx.files.srcs + [ctx.file._bundle_libs],
        outputs = [out],
        mnemonic = "BundleSharedLibs",
        progress_message = "Bundling the shared libraries %s needs" % ctx.label,
    )
    return [DefaultInfo(files = depset([out]))]

bundled_shared_libs = rule(
    implementation = _bundled_shared_libs_impl,
    doc = "The non-system shared libraries `srcs` load (their ldd closure minus the manylinux base set), copied with RPATH=$ORIGIN so they find each other.",
    attrs = {
        "srcs": attr.label_list(allow_files = [".so"], mandatory = True),
        "_python": attr.label(default = "@local_config_python//:python3", executable = True, cfg = "exec"),
        "_bundle_libs": attr.label(default = "//bazel/wheel:bundle_libs.py", allow_single_file = True),
    },
)
