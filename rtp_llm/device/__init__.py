"""Device backends, chosen once per process (no `if device == ...` elsewhere)."""

import importlib
from typing import Type

from rtp_llm.device.base import AttentionMetadata, DeviceBackend  # noqa: F401

_BACKENDS = {
    "cpu": "rtp_llm.device.cpu.backend:CpuBackend",
    "cuda": "rtp_llm.device.cuda.backend:CudaBackend",
    "npu": "rtp_llm.device.npu.backend:NpuBackend",
}


def backend_class(name: str) -> Type[DeviceBackend]:
    """The backend of --device `name` (also a torch.device type), not built: its class-level
    choices (the distributed backend, the rank's device) come before the device is set up."""
    if name not in _BACKENDS:
        raise ValueError(f"device {name!r} is not supported here; available: {', '.join(sorted(_BACKENDS))}")
    module, cls = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def get_backend(name: str) -> DeviceBackend:
    return backend_class(name)()
