"""Warm pools of ready sandboxes, and the only code that creates and destroys containers."""

from rlsandbox.daemon.pool.factory import EPISODES_DOING, HOST_OOM, SandboxFactory, SetupFailed
from rlsandbox.daemon.pool.reconciler import Reconciler
from rlsandbox.daemon.pool.spec import PoolSpec
from rlsandbox.daemon.pool.warm_pool import CreateLimiter, PoolStats, WarmPool

__all__ = [
    "EPISODES_DOING",
    "HOST_OOM",
    "CreateLimiter",
    "PoolSpec",
    "PoolStats",
    "Reconciler",
    "SandboxFactory",
    "SetupFailed",
    "WarmPool",
]
