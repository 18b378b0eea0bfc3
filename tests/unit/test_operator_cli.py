"""The operator commands against a daemon that does not answer (issue 48): one line saying so,
not a traceback; a live view that says so and keeps asking; $RLSANDBOX_TARGET for every command."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from rlsandbox.daemon import cli
from rlsandbox.daemon.events.nats_server import free_port


def test_status_and_drain_of_a_stopped_daemon_say_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    target = f"127.0.0.1:{free_port()}"  # nothing listens there
    for command in (["status"], ["drain"]):
        assert cli.main([*command, "--target", target]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"rlsandbox: {target}: UNAVAILABLE"), err


@pytest.mark.processes
def test_the_live_view_rides_through_a_daemon_that_does_not_answer_and_the_target_comes_from_the_environment() -> None:
    target = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "RLSANDBOX_TARGET": target}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlsandbox.daemon.cli", "status", "--watch", "0.1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    with pytest.raises(subprocess.TimeoutExpired):  # before, it exited at the first failed poll
        proc.communicate(timeout=6)
    proc.kill()  # still asking: what a live view does
    out, err = proc.communicate()
    assert out.count(f"{target}: not answering") >= 1, (out, err)
    assert "Traceback" not in err, err


def test_up_keeps_its_state_under_the_state_dir_and_takes_metrics_and_no_demo(tmp_path: object) -> None:
    """Before, --state-dir did not move the session journal, and up had no flag for metrics, the
    aggregator's address or skipping the demo (every start added a 'demo' run)."""
    from rlsandbox.daemon.cli import build_parser
    from rlsandbox.daemon.cli_serve import up_config

    args = build_parser().parse_args(
        ["up", "--state-dir", str(tmp_path), "--metrics", "127.0.0.1:9464", "--no-demo", "--aggregator-http", ""]
    )
    config = up_config(args)
    assert config.session_journal == f"{tmp_path}/sessions.sqlite3" and config.metrics_listen == "127.0.0.1:9464"
    assert args.no_demo and args.aggregator_http == ""
