#!/bin/sh
exec aarch64-linux-gnu-strip "$@"
