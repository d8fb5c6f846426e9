"""A repository that a Debian package installs (offline replacement for an http_archive)."""

load("//3rdparty:common.bzl", "config_fail")

def _debian_repository_impl(repository_ctx):
    src = repository_ctx.path(repository_ctx.attr.path)
    if not src.exists:
        config_fail(repository_ctx.name, "%s not found: install it with `apt-get install %s` (scripts/bootstrap.sh does)." % (repository_ctx.attr.path, repository_ctx.attr.package))
    for child in src.readdir():
        repository_ctx.symlink(child, child.basename)

debian_repository = repository_rule(
    implementation = _debian_repository_impl,
    local = True,
    attrs = {
        "path": attr.string(mandatory = True, doc = "Where the Debian package installs the repository."),
        "package": attr.string(mandatory = True, doc = "The Debian package to name in the error."),
    },
)
