"""Subcommands that run services (daemon, up); filled in by the API work."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(sub: Any) -> None:
    del sub  # the daemon and `up` are added with the gRPC API


__all__ = ["add_commands", "argparse"]
