"""Server flags, upstream's names; every flag has an environment twin in upper case
(--start_port / START_PORT). Flags win over the environment."""

import argparse
import math
import os
import sys
from dataclasses import dataclass, field, fields
from typing import List, Optional

from rtp_llm.config import quantization as quantization_flag
from rtp_llm.config.model_config import LOAD_FORMATS
from rtp_llm.config.parallel_config import ParallelConfig
from rtp_llm.config.output_parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from rtp_llm.config.pd_config import RPC_PORT_OFFSET, PdConfig
from rtp_llm.config.speculative import SpeculativeConfig
from rtp_llm.config.upstream_flags import unsupported_upstream_flag

MAX_DEFAULT_FRONTENDS = 16


CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"  # cgroup v2: "<quota> <period>" or "max <period>"


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity mask (taskset, a cpuset), lowered to its
    cgroup's CPU quota where one is set (a container's CPU limit, which the mask does not show)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        with open(CGROUP_CPU_MAX) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass  # no cgroup v2 CPU controller here: the mask is all there is
    return cpus


def default_frontend_server_count() -> int:
    """--frontend_server_count's default: half the usable CPUs (usable_cpus), at least 1, at
    most MAX_DEFAULT_FRONTENDS. Half, not all: the backend's engine thread, its gRPC threads
    and the frontends' tokenizing need cores too, and a frontend without a core of its own
    only adds context switches."""
    return max(1, min(MAX_DEFAULT_FRONTENDS, usable_cpus() // 2))


@dataclass
class ServerConfig:
    checkpoint_path: str = ""
    model_type: Optional[str] = None
    tokenizer_path: Optional[str] = None
    start_port: int = 8088                 # HTTP; the engine's gRPC server listens on start_port + 1
    frontend_server_count: int = field(default_factory=default_frontend_server_count)
    # Requests in flight per frontend process; more get 429. Upstream's default is 32; ours is
    # larger on purpose: the engine queues what it cannot run yet (--max_queue_size bounds that
    # queue), so this only guards a frontend's memory and event loop against a flood, and 256
    # concurrent clients on one frontend (a 2-core machine's default) are all admitted.
    concurrency_limit: int = 1024
    max_seq_len: Optional[int] = None
    max_batch_size: int = 32
    max_num_batched_tokens: Optional[int] = None  # per-step token budget; default: the device's
    seq_size_per_block: int = 16
    kv_cache_mem_mb: Optional[int] = None
    kv_cache_dtype: str = "auto"           # "auto": the run dtype; "fp8": e4m3 K/V (CUDA, Ada / Hopper)
    reuse_cache: bool = True
    act_type: str = "bf16"
    # Weights quantized at load (model_loader/quantize_at_load.py): "int8" (upstream writes INT8;
    # --int8_mode=1 is the same), on the CPU; "" keeps the checkpoint's dtype.
    quantization: str = ""
    int8_mode: int = 0
    # Where the weights come from (config/model_config.py LOAD_FORMATS): "dummy" makes random
    # ones of config.json's shapes, for benchmarks only.
    load_format: str = "auto"
    device: str = "cpu"
    cuda_graph: bool = True                # decode and prefill steps replay captured CUDA graphs
    overlap_schedule: bool = True          # schedule step N+1 while the device runs step N (CUDA)
    host: str = "0.0.0.0"                  # HTTP bind address (the gRPC port is always loopback)
    api_key: Optional[str] = None          # if set, every route but /health and /status needs it
    max_queue_size: int = 0                # streams waiting in the engine's queue; more get 429 (0: no cap)
    max_body_size: int = 8 << 20           # request body bytes; larger gets 413
    default_timeout_ms: int = 0            # for requests without timeout_ms (0: none); expired -> 504
    engine_stall_timeout_s: int = 60       # /health fails after this long without a step while work waits (0: never)
    # Tensor parallelism (upstream's names): tp_size ranks in all, local_world_size of them on
    # this node, whose first rank is world_rank (node index x local_world_size). The node with
    # rank 0 runs the engine core and the frontends. Ranks meet at master_addr:master_port.
    tp_size: int = 1
    world_size: int = 0                    # 0: tp_size
    world_rank: int = 0
    local_world_size: int = 0              # 0: world_size (one node)
    master_addr: str = "127.0.0.1"
    master_port: int = 0                   # 0: start_port + 3
    dist_timeout_s: int = 120              # a collective waiting longer ends the server (a rank died)
    # Tokens a stream accumulates per streamed event (vLLM's --stream-interval); a stream's first
    # and last tokens are never held back.
    stream_interval: int = 1
    # Chat answers' thinking goes to reasoning_content, and their tool calls to tool_calls
    # (names in config/output_parsers.py); "" leaves them in content (and refuses tools).
    reasoning_parser: str = ""
    tool_call_parser: str = ""
    # Structured output (upstream's names): grammar compile threads in the engine process, how
    # long a stream waits for its grammar to compile before it fails, and JSON without optional
    # whitespace (upstream's default is False: any whitespace; ours is compact, so a model
    # cannot loop on spaces).
    grammar_num_workers: int = 2
    grammar_admission_compile_timeout_s: float = 30.0
    constrained_json_disable_any_whitespace: bool = True
    # Benchmark only (async_decoder_engine/paced.py): > 0 runs no model; every engine step sleeps
    # this long and emits a fixed text's tokens, to measure the serving path without a GPU.
    paced_engine_step_ms: float = 0.0
    # Diagnostics: the engine logs its thread's host time by phase (schedule, stage, sample,
    # device wait, commit, grammar work) once per burst of load (async_decoder_engine/host_profile.py).
    host_profile: bool = False
    # Speculative decoding (upstream's flags; config/speculative.py): --sp_type=ngram (or
    # deterministic) drafts up to gen_num_per_cycle tokens per stream by prompt lookup;
    # --sp_type=vanilla with the draft model at --sp_checkpoint_path (--sp_model_type).
    sp_type: str = ""
    gen_num_per_cycle: int = SpeculativeConfig.gen_num_per_cycle
    sp_min_token_match: int = SpeculativeConfig.sp_min_token_match
    sp_max_token_match: int = SpeculativeConfig.sp_max_token_match
    sp_checkpoint_path: str = ""
    sp_model_type: str = ""
    sp_draft_pace: str = SpeculativeConfig.sp_draft_pace
    # Prefill/decode disaggregation (upstream's flags; config/pd_config.py): PDFUSION, PREFILL
    # (the entry; hands requests to the DECODE instance at remote_rpc_server_ip) or DECODE.
    role_type: str = "PDFUSION"
    remote_rpc_server_ip: str = ""
    kv_transfer_host: str = ""             # where peers reach this instance's KV transfer ("": this host's address)

    def validate(self) -> None:
        if not self.checkpoint_path:
            raise ValueError("--checkpoint_path (or CHECKPOINT_PATH) is required")
        if not os.path.exists(self.checkpoint_path):
            raise ValueError(f"--checkpoint_path {self.checkpoint_path} does not exist")
        if not 1 <= self.start_port <= 65534:
            raise ValueError(f"--start_port must be in [1, 65534], got {self.start_port}")
        for name in ("frontend_server_count", "concurrency_limit", "max_body_size", "stream_interval",
                     "grammar_num_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"--max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        for name in ("max_queue_size", "default_timeout_ms", "engine_stall_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be >= 0, got {getattr(self, name)}")
        for name, choices in (("reasoning_parser", REASONING_PARSERS), ("tool_call_parser", TOOL_CALL_PARSERS)):
            value = getattr(self, name)
            if value and value not in choices:
                raise ValueError(f"--{name} must be one of {', '.join(sorted(choices))} (or empty), got {value!r}")
        timeout = self.grammar_admission_compile_timeout_s
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"--grammar_admission_compile_timeout_s must be a finite number > 0, got {timeout}")
        if not (math.isfinite(self.paced_engine_step_ms) and self.paced_engine_step_ms >= 0):
            raise ValueError(f"--paced_engine_step_ms must be a finite number >= 0, got {self.paced_engine_step_ms}")
        self.speculative().validate()
        if self.sp_checkpoint_path and not os.path.exists(self.sp_checkpoint_path):
            raise ValueError(f"--sp_checkpoint_path {self.sp_checkpoint_path} does not exist")
        self.speculative().check_ranks(self.tp_size)
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"--load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        self.quantization = quantization_flag.scheme(self.quantization, self.int8_mode) or ""
        quantization_flag.check(self.quantization or None, self.device, self.act_type)
        quantization_flag.check_kv_cache_dtype(self.kv_cache_dtype, self.device)
        self.pd().validate(self.tp_size, self.sp_type, self.reuse_cache, bool(self.paced_engine_step_ms))
        if self.paced_engine_step_ms and self.tp_size != 1:
            raise ValueError(f"--paced_engine_step_ms runs no model: it needs --tp_size=1, got {self.tp_size}")
        self.world_size = self.world_size or self.tp_size
        self.local_world_size = self.local_world_size or self.world_size
        self.master_port = self.master_port or self.start_port + 3
        if not 1 <= self.local_world_size <= self.world_size:
            raise ValueError(f"--local_world_size must be in [1, --world_size={self.world_size}], got "
                             f"{self.local_world_size}")
        self.parallel(self.world_rank).validate()

    def parallel(self, rank: int) -> ParallelConfig:
        """This node's rank `rank` (a global rank) as a ParallelConfig."""
        return ParallelConfig(tp_size=self.tp_size, world_size=self.world_size, world_rank=rank,
                              local_world_size=self.local_world_size, master_addr=self.master_addr,
                              master_port=self.master_port, dist_timeout_s=self.dist_timeout_s)

    @property
    def local_ranks(self) -> range:
        """The launcher's ranks: --world_rank is then this node's first one."""
        if self.world_rank % self.local_world_size or self.world_rank + self.local_world_size > self.world_size:
            raise ValueError(f"--world_rank ({self.world_rank}) must be a node's first rank: a multiple of "
                             f"--local_world_size ({self.local_world_size}) below --world_size ({self.world_size})")
        return range(self.world_rank, self.world_rank + self.local_world_size)

    @property
    def rpc_address(self) -> str:
        """Where this instance's frontends reach its RPC service."""
        return f"127.0.0.1:{self.start_port + RPC_PORT_OFFSET}"

    @property
    def rpc_bind_address(self) -> str:
        return f"{self.pd().rpc_bind_host}:{self.start_port + RPC_PORT_OFFSET}"

    def pd(self) -> PdConfig:
        return PdConfig(self.role_type, self.remote_rpc_server_ip, self.kv_transfer_host, self.start_port)

    def speculative(self) -> SpeculativeConfig:
        return SpeculativeConfig(self.sp_type, self.gen_num_per_cycle, self.sp_min_token_match,
                                 self.sp_max_token_match, self.sp_checkpoint_path, self.sp_model_type,
                                 self.sp_draft_pace)

    def to_args(self) -> List[str]:
        """Flags for a child process; the API key goes through the environment instead (argv
        is visible to every user of the machine)."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and f.name != "api_key":
                out.append(f"--{f.name}={int(value) if isinstance(value, bool) else value}")
        return out


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def _refuse_upstream_flags(argv: List[str]) -> None:
    """An upstream flag this server does not implement is refused by name, with what to use
    instead (argparse would only say "unrecognized arguments")."""
    ours = {f.name for f in fields(ServerConfig)}
    for arg in argv:
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        why = unsupported_upstream_flag(name) if name and name not in ours else None
        if why:
            raise ValueError(why)


def parse_server_config(argv=None, description: str = "") -> ServerConfig:
    _refuse_upstream_flags(sys.argv[1:] if argv is None else list(argv))
    p = argparse.ArgumentParser(description=description)
    defaults = ServerConfig()
    for f in fields(ServerConfig):
        default = getattr(defaults, f.name)
        kind = {bool: _parse_bool, int: int, float: float}.get(type(default), str)
        if f.name in ("max_seq_len", "kv_cache_mem_mb", "max_num_batched_tokens"):
            kind = int
        if f.name in ("model_type", "tokenizer_path", "api_key"):
            kind = str
        env = os.environ.get(f.name.upper())
        # An environment value is a string default: argparse converts it with `kind`, so a bad
        # one is an error naming the flag, as a bad flag is.
        p.add_argument(f"--{f.name}", type=kind, default=env if env is not None else default,
                       help=f"env {f.name.upper()}; default {default}")
    config = ServerConfig(**vars(p.parse_args(argv)))
    config.validate()
    return config
