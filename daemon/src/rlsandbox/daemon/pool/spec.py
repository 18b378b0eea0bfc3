"""What a warm pool keeps ready."""

from __future__ import annotations

from dataclasses import dataclass

from rlsandbox.daemon.model import ContainerSpec


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A pool of identical sandboxes.

    Attributes:
        name: the pool's name, used by clients to ask for a sandbox.
        container: image, limits, OCI runtime and isolation of every sandbox.
        min_ready: sandboxes kept ready (created, started, set up) ahead of demand.
        max_total: ready + in use + being created never exceeds this.
        setup: shell commands run in each new sandbox before it counts as ready.
        setup_timeout: seconds each setup command may take.
        start_timeout: seconds for the agent to answer its first ping.
        recycle: a released sandbox is reset and verified by its agent and serves the next
            episode (docs/RELIABILITY.md: what the reset proves); any doubt destroys it instead.
        max_reuses: episodes a recycled sandbox serves at most (then it is destroyed).
        room_headroom: clean rooms that may be made past ``max_total`` when every sandbox is in
            use: a graded episode keeps its own sandbox while it waits for its room, so a pool
            full of grading sessions would otherwise wait for rooms until the acquire timeout.
    """

    name: str
    container: ContainerSpec
    min_ready: int = 2
    max_total: int = 64
    setup: tuple[str, ...] = ()
    setup_timeout: float = 120.0
    start_timeout: float = 30.0
    recycle: bool = False
    max_reuses: int = 50
    room_headroom: int = 2
