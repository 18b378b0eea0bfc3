"""The Prometheus alert rules (deploy/prometheus/alerts.yml) are valid and fire when they should,
checked by Prometheus's own promtool (`promtool test rules` on tests/fixtures/prometheus)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
TESTS = ROOT / "tests" / "fixtures" / "prometheus" / "alerts_test.yml"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed (Debian package prometheus); run scripts/bootstrap.sh", pytrace=False)
    return found


def test_rules_are_valid() -> None:
    run = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_rules_fire_as_their_tests_say() -> None:
    run = subprocess.run([promtool(), "test", "rules", TESTS.name], cwd=TESTS.parent, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def exported() -> set[str]:
    """Metric names the daemon (metrics.py) and the aggregator (events/web.py) export, without
    their sample suffixes."""
    daemon = ROOT / "daemon" / "src" / "rlsandbox" / "daemon"
    source = (daemon / "metrics.py").read_text() + (daemon / "events" / "web.py").read_text()
    names = set(re.findall(r'"(rlsandbox_[a-z_]+)"', source))
    names |= {f"rlsandbox_pool_{f}" for f in re.findall(r'"([a-z_]+)": "', source)}  # the pool families
    return {base(n) for n in names}


def base(name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_total"):
        name = name.removesuffix(suffix)
    return name


def unknown_metrics(text: str) -> set[str]:
    known = exported()
    return {n for n in re.findall(r"\b(rlsandbox_[a-z_]+)", text) if base(n) not in known}


def test_every_metric_an_alert_uses_is_one_the_daemon_exports() -> None:
    """A renamed metric must not leave an alert that can never fire."""
    assert not unknown_metrics(RULES.read_text())
    assert unknown_metrics("rate(rlsandbox_no_such_thing_total[5m])") == {"rlsandbox_no_such_thing_total"}


def test_the_grafana_dashboard_queries_only_exported_metrics() -> None:
    import json

    dash = json.loads((ROOT / "deploy" / "grafana" / "rlsandbox.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 13 and not unknown_metrics("\n".join(exprs))
