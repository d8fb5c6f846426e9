"""Device backends, chosen once per process (no `if device == ...` elsewhere)."""

from rtp_llm.device.base import AttentionMetadata, DeviceBackend  # noqa: F401

_BACKENDS = {
    "cpu": "rtp_llm.device.cpu.backend:CpuBackend",
    "cuda": "rtp_llm.device.cuda.backend:CudaBackend",
    "npu": "rtp_llm.device.npu.backend:NpuBackend",
}


def get_backend(name: str) -> DeviceBackend:
    if name not in _BACKENDS:
        raise ValueError(f"device {name!r} is not supported here; available: {', '.join(sorted(_BACKENDS))}")
    module, cls = _BACKENDS[name].split(":")
    import importlib

    return getattr(importlib.import_module(module), cls)()
