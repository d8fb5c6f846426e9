#!/bin/sh
echo "bazel coverage is not supported by this offline build (see docs/build.md)" >&2
exit 1
