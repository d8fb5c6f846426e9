"""rtp_llm: an offline-buildable re-implementation of Alibaba's RTP-LLM inference engine."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("rtp_llm")
except _metadata.PackageNotFoundError:  # running from the source tree
    __version__ = "0+source"
