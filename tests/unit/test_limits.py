"""The daemon raises its open-files limit: every agent socket is one of its descriptors."""

from __future__ import annotations

import resource

from rlsandbox.daemon.process import raise_open_files_limit


def test_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(512, hard), hard))
        assert raise_open_files_limit(max_sessions=10) == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
