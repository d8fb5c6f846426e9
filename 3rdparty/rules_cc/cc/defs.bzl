"""Offline stand-in for rules_cc: re-exports Bazel's native C++ rules.

Debian's bazel-rules-cc needs a newer Bazel than bazel-bootstrap 4.2.3; the native rules are
what rules_cc wraps anyway, so `load("@rules_cc//cc:defs.bzl", ...)` works unchanged."""

cc_binary = native.cc_binary
cc_library = native.cc_library
cc_test = native.cc_test
cc_import = native.cc_import
cc_proto_library = native.cc_proto_library
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
objc_library = native.objc_library
