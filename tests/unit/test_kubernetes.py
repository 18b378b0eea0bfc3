"""deploy/kubernetes/: every manifest valid against the Kubernetes schemas (offline, strict: no
field the API would drop), and consistent with the daemon it deploys: the ConfigMap's daemon.toml
loads as the daemon loads it, the paths the host's engine binds are hostPaths at the same path,
the grace covers the daemon's own, the probes and ports are the ones it serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from rlsandbox.daemon.config import load_config
from rlsandbox.daemon.runtime.cgroups import CGROUP_ROOT

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
K8S_VERSIONS = ["1.29.0", "1.33.0"]  # the oldest supported release we target and a recent one
NOT_OBJECTS = {"kustomization.yaml", "nats-values.yaml"}


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name not in NOT_OBJECTS:
            out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def find(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d[0]}:{d[1]['kind']}")
def test_every_manifest_is_valid_against_the_schemas(doc: tuple[str, dict[str, Any]], version: str) -> None:
    kubernetes_validate.validate(doc[1], version, strict=True)


def test_a_broken_manifest_is_caught() -> None:
    """The check above can fail: a misspelt field and a wrong type are errors."""
    ds = find("DaemonSet", "rlsandbox-daemon")
    misspelt = {**ds, "spec": {**ds["spec"], "updateStrategie": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt, K8S_VERSIONS[-1], strict=True)
    wrong = yaml.safe_load(yaml.safe_dump(ds))
    wrong["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "ninety"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, K8S_VERSIONS[-1], strict=True)


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - NOT_OBJECTS
    assert set(kustomization["resources"]) == on_disk


def daemon_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    cm = find("ConfigMap", "rlsandbox-daemon")
    path = tmp_path / "daemon.toml"
    path.write_text(cm["data"]["daemon.toml"])
    ds = find("DaemonSet", "rlsandbox-daemon")
    env = {e["name"]: e for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RLSANDBOX_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    monkeypatch.setenv("RLSANDBOX_NODE_ID", "gpu-node-7")
    monkeypatch.setenv("RLSANDBOX_ADVERTISE_ADDRESS", "10.1.2.3:7420")
    return load_config(path)


def test_the_daemon_config_loads_and_the_pod_gives_it_what_it_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = daemon_toml(tmp_path, monkeypatch)
    assert config.node_id == "gpu-node-7" and config.advertise_address == "10.1.2.3:7420"
    ds = find("DaemonSet", "rlsandbox-daemon")
    pod = ds["spec"]["template"]["spec"]
    [daemon] = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in daemon["volumeMounts"]}

    def mounted(path: str) -> tuple[str, dict[str, Any]]:
        best = max((m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")), key=len)
        return best, mounts[best]

    # What the host's engine binds into sandboxes must be at the same path on the host.
    for path in (config.agent_socket_root, config.agent_host_dir, config.docker_socket):
        at, volume = mounted(path)
        assert volume.get("hostPath", {}).get("path") == at, f"{path} is not a hostPath at the same path"
    # The node-wide caps are written in the host's cgroups, not in the pod's namespace.
    at, volume = mounted(str(CGROUP_ROOT / "rlsandbox" / "pids.max"))
    assert at == str(CGROUP_ROOT) and volume.get("hostPath", {}).get("path") == str(CGROUP_ROOT)
    assert not any(m.get("readOnly") for m in daemon["volumeMounts"] if m["mountPath"] == at)
    # The journal outlives the pod (a restarted daemon re-adopts its sessions).
    assert "hostPath" in mounted(config.session_journal)[1]
    for path in (config.tls_cert, config.tls_key, config.auth_token_file):
        assert "secret" in mounted(path)[1], path
    # Ports and probes are the daemon's.
    ports = {p["name"]: p["containerPort"] for p in daemon["ports"]}
    assert ports["grpc"] == int(config.listen_tcp.rsplit(":", 1)[1])
    assert ports["metrics"] == int(config.metrics_listen.rsplit(":", 1)[1])
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert daemon[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # SIGTERM: calls finish within shutdown_grace, sandboxes go within shutdown_cleanup.
    assert pod["terminationGracePeriodSeconds"] >= config.shutdown_grace + config.shutdown_cleanup
    assert daemon["args"][:1] == ["daemon"] and "--config" in daemon["args"]


def test_the_headless_service_selects_the_daemons() -> None:
    svc = find("Service", "rlsandbox-daemon")
    ds = find("DaemonSet", "rlsandbox-daemon")
    assert svc["spec"]["clusterIP"] == "None"
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    agg = find("Deployment", "rlsandbox-aggregator")
    assert (
        find("Service", "rlsandbox-aggregator")["spec"]["selector"].items()
        <= agg["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_aggregators_share_the_postgresql_the_manifests_run() -> None:
    """The aggregators read their database URL from the environment variable the command line
    reads, out of a Secret; the StatefulSet's headless Service selects its pods and is the host
    docs/CLUSTER.md puts in that URL; the image has psycopg."""
    from rlsandbox.daemon.cli_events import DB_ENV

    agg = find("Deployment", "rlsandbox-aggregator")
    (container,) = agg["spec"]["template"]["spec"]["containers"]
    assert agg["spec"]["replicas"] >= 2 and not any(a.startswith("--db") for a in container["args"])
    (db_env,) = [e for e in container["env"] if e["name"] == DB_ENV]
    assert db_env["valueFrom"]["secretKeyRef"] == {"name": "rlsandbox-aggregator-db", "key": "url"}
    pg = find("StatefulSet", "rlsandbox-postgres")
    svc = find("Service", pg["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= pg["spec"]["template"]["metadata"]["labels"].items()
    (pg_container,) = pg["spec"]["template"]["spec"]["containers"]
    user = next(e["value"] for e in pg_container["env"] if e["name"] == "POSTGRES_USER")
    database = next(e["value"] for e in pg_container["env"] if e["name"] == "POSTGRES_DB")
    docs = (DEPLOY.parents[1] / "docs" / "CLUSTER.md").read_text()
    url = f"postgresql://{user}:PASSWORD@{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:5432/{database}"
    assert url in docs
    assert "[postgres]" in (DEPLOY / "Dockerfile").read_text()


def test_the_nats_values_keep_three_jetstream_replicas() -> None:
    values = yaml.safe_load((DEPLOY / "nats-values.yaml").read_text())
    assert values["config"]["jetstream"]["enabled"] is True
    assert values["config"]["cluster"]["enabled"] is True and values["config"]["cluster"]["replicas"] == 3
    ds = find("DaemonSet", "rlsandbox-daemon")
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":0.1.0")
