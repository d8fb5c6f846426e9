"""Prefill/decode disaggregation's roles and addresses (upstream's flags; docs/deploy.md).

PDFUSION serves whole requests. A PREFILL instance is the entry: it runs each request's prompt and
first token, then hands the request to the DECODE instance at --remote_rpc_server_ip (its RPC
service: "host:port", or "host" with the port this instance's layout gives it), which reads the
prompt's KV blocks from the PREFILL instance through the KV transfer engine (rtp_llm/pd/) and
generates the rest; the client sees one response from the entry.

Ports (offsets from --start_port, as the other processes'): +1 the RPC service (a DECODE
instance serves it on every interface, for its PREFILL instances; the others on loopback only),
+5 the KV transfer engine's listener (a PREFILL instance's: where decode instances fetch its
metadata)."""

import socket
from dataclasses import dataclass

ROLE_TYPES = ("PDFUSION", "PREFILL", "DECODE")
RPC_PORT_OFFSET = 1
KV_TRANSFER_PORT_OFFSET = 5
KV_TRANSFER_ENGINE = "nixl"


@dataclass(frozen=True)
class PdConfig:
    role_type: str = "PDFUSION"
    remote_rpc_server_ip: str = ""
    kv_transfer_host: str = ""  # where peers reach this instance's KV transfer ("": this host's address)
    start_port: int = 8088

    @property
    def disaggregated(self) -> bool:
        return self.role_type != "PDFUSION"

    def validate(self, tp_size: int, sp_type: str, reuse_cache: bool, draft_or_paced: bool = False) -> None:
        if self.role_type not in ROLE_TYPES:
            raise ValueError(f"--role_type must be one of {', '.join(ROLE_TYPES)}, got {self.role_type!r}")
        if self.role_type == "PREFILL" and not self.remote_rpc_server_ip:
            raise ValueError("--role_type=PREFILL needs --remote_rpc_server_ip: the DECODE instance's RPC address "
                             "(host:port, or host)")
        if self.role_type != "PREFILL" and self.remote_rpc_server_ip:
            raise ValueError(f"--remote_rpc_server_ip is the PREFILL instance's flag; --role_type is "
                             f"{self.role_type}")
        if not self.disaggregated:
            return
        if tp_size != 1:
            raise ValueError(f"--role_type={self.role_type} runs on one rank for now: it needs --tp_size=1, got "
                             f"{tp_size}")
        if sp_type or draft_or_paced:
            raise ValueError(f"--role_type={self.role_type} does not combine with speculative decoding "
                             "(--sp_type) or --paced_engine_step_ms yet")
        if self.role_type == "DECODE" and not reuse_cache:
            raise ValueError("--role_type=DECODE needs --reuse_cache=1: the KV blocks it reads go into its prefix "
                             "cache")
        _ = self.decode_address if self.role_type == "PREFILL" else None  # a malformed address fails here

    @property
    def decode_address(self) -> str:
        """The DECODE instance's RPC service, host:port."""
        host, sep, port = self.remote_rpc_server_ip.rpartition(":")
        if not sep:
            return f"{self.remote_rpc_server_ip}:{self.start_port + RPC_PORT_OFFSET}"
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"--remote_rpc_server_ip must be host:port or host, got {self.remote_rpc_server_ip!r}")
        return f"{host}:{port}"

    @property
    def rpc_bind_host(self) -> str:
        """A DECODE instance's RPC service takes its PREFILL instances' requests: every interface."""
        return "0.0.0.0" if self.role_type == "DECODE" else "127.0.0.1"

    @property
    def kv_transfer_port(self) -> int:
        return self.start_port + KV_TRANSFER_PORT_OFFSET

    def advertised_host(self) -> str:
        return self.kv_transfer_host or socket.gethostbyname(socket.gethostname())
