"""Loaders for the native libraries shipped in rtp_llm/libs/.

- ensure_engine_ops_loaded(): the engine core libth_transformer.so (C ABI, via ctypes).
- ensure_compute_ops_loaded(): the torch-linked extension librtp_compute_ops.so.

Both load once per process and raise NativeLibraryError naming the file and the cause.
RTP_LLM_LIBS_DIR overrides where the libraries are looked up.
"""

import ctypes
import functools
import importlib.util
import os
from pathlib import Path

ENGINE_LIB = "libth_transformer.so"
COMPUTE_OPS_MODULE = "librtp_compute_ops"
# Must equal RTP_LLM_ABI_VERSION in rtp_llm/cpp/api/c_api.h (it covers engine_api.h and the lists of
# rtp_llm/cpp/engine/step_batch_fields.h; engine_core.py also checks its struct mirrors at load).
ENGINE_ABI_VERSION = 13


class NativeLibraryError(ImportError):
    """A native library of rtp_llm is missing or cannot be loaded."""


def libs_dir() -> Path:
    override = os.environ.get("RTP_LLM_LIBS_DIR")
    return Path(override) if override else Path(__file__).parent.parent / "libs"


def _lib_path(filename: str) -> Path:
    path = libs_dir() / filename
    if not path.is_file():
        raise NativeLibraryError(
            f"{filename} not found in {path.parent}: the rtp_llm installation is incomplete "
            f"(reinstall the wheel built by `bazelisk build //rtp_llm:rtp_llm_whl`), or "
            f"RTP_LLM_LIBS_DIR points to the wrong directory."
        )
    return path


@functools.lru_cache(maxsize=None)
def ensure_engine_ops_loaded() -> ctypes.CDLL:
    path = _lib_path(ENGINE_LIB)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise NativeLibraryError(f"cannot load {path}: {e}") from e
    lib.rtp_llm_abi_version.restype = ctypes.c_int
    lib.rtp_llm_build_info.restype = ctypes.c_char_p
    abi = lib.rtp_llm_abi_version()
    if abi != ENGINE_ABI_VERSION:
        raise NativeLibraryError(
            f"{path} has C ABI version {abi}, but this rtp_llm package expects "
            f"{ENGINE_ABI_VERSION}: the library and the Python package come from different builds."
        )
    return lib


@functools.lru_cache(maxsize=None)
def ensure_compute_ops_loaded():
    try:
        import torch  # noqa: F401  (loads libtorch/libc10, which the extension links)
    except ImportError as e:
        raise NativeLibraryError(f"{COMPUTE_OPS_MODULE} needs torch, which is not importable: {e}") from e
    path = _lib_path(COMPUTE_OPS_MODULE + ".so")
    spec = importlib.util.spec_from_file_location(COMPUTE_OPS_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        raise NativeLibraryError(
            f"cannot load {path}: {e} (it must be loaded with the torch it was built against; "
            f"see the torch pin in the wheel's metadata)"
        ) from e
    return module


def engine_build_info() -> str:
    return ensure_engine_ops_loaded().rtp_llm_build_info().decode()
