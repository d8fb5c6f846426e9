"""Compiler flags for the project's own C++ (not for generated or third-party code)."""

RTP_COPTS = ["-Wall", "-Wextra", "-Werror"]
