"""Where a tensor-parallel rank sits in its group and where the ranks meet."""

from dataclasses import dataclass


@dataclass
class ParallelConfig:
    """Upstream's flags (each with an upper-case env twin)."""

    tp_size: int = 1
    world_size: int = 1
    world_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0            # 0: pick a free one (single-node launches)
    dist_timeout_s: int = 120

    def validate(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"--tp_size must be >= 1, got {self.tp_size}")
        if self.world_size != self.tp_size:
            raise ValueError(f"--world_size ({self.world_size}) must equal --tp_size ({self.tp_size}): only tensor "
                             f"parallelism is supported")
        if not 0 <= self.world_rank < self.world_size:
            raise ValueError(f"--world_rank must be in [0, {self.world_size}), got {self.world_rank}")

    @property
    def local_rank(self) -> int:
        """This rank's index on its node (which of the node's devices it runs on)."""
        return self.world_rank % self.local_world_size
