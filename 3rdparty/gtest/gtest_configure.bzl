"""GoogleTest built from Debian's sources (package googletest, /usr/src/googletest).

GTEST_SRC_DIR overrides the location. Exposes @com_google_googletest//:gtest and :gtest_main,
the names upstream's BUILD files use."""

load("//3rdparty:common.bzl", "config_fail")

_DEFAULT_SRC = "/usr/src/googletest"

_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "gtest",
    srcs = [
        "googletest/src/gtest-all.cc",
        "googlemock/src/gmock-all.cc",
    ],
    hdrs = glob([
        "googletest/include/**/*.h",
        "googlemock/include/**/*.h",
    ]),
    textual_hdrs = glob([
        "googletest/src/*.cc",
        "googletest/src/*.h",
        "googlemock/src/*.cc",
    ]),
    includes = [
        "googlemock",
        "googlemock/include",
        "googletest",
        "googletest/include",
    ],
    copts = ["-w"],
    linkopts = ["-pthread"],
)

cc_library(
    name = "gtest_main",
    srcs = ["googletest/src/gtest_main.cc"],
    deps = [":gtest"],
)
"""

def _gtest_configure_impl(repository_ctx):
    src = repository_ctx.os.environ.get("GTEST_SRC_DIR", _DEFAULT_SRC)
    root = repository_ctx.path(src)
    if not root.get_child("googletest").get_child("src").get_child("gtest-all.cc").exists:
        config_fail(repository_ctx.name, "GoogleTest sources not found in %s: apt-get install googletest (scripts/bootstrap.sh does), or set GTEST_SRC_DIR to a googletest source tree." % src)
    repository_ctx.symlink(root.get_child("googletest"), "googletest")
    repository_ctx.symlink(root.get_child("googlemock"), "googlemock")
    repository_ctx.file("BUILD", _BUILD)

gtest_configure = repository_rule(
    implementation = _gtest_configure_impl,
    environ = ["GTEST_SRC_DIR"],
    local = True,
)
