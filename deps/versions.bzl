"""The rtp_llm package's own version (dependency versions live in the requirements files)."""

RTP_LLM_VERSION = "0.1.0"
