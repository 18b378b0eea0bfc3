#!/usr/bin/env bash
# Sets up a Debian machine (as root) for rlsandbox, idempotently: system packages, a running
# Docker engine with gVisor (runsc) registered, the Python environment in .venv, the images.
# Everything it does is skipped when already done, so running it again costs a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
log() { printf '[bootstrap] %s\n' "$*" >&2; }

need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v runsc >/dev/null || need_pkgs+=(runsc)
command -v mmdebstrap >/dev/null || need_pkgs+=(mmdebstrap)
[ -x /bin/busybox ] || need_pkgs+=(busybox-static)
command -v docker-registry >/dev/null || need_pkgs+=(docker-registry)  # a local registry for the image-pool tests
python3 -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
apt_updated=""
apt_install() {  # apt_install [--no-install-recommends] package...
  [ -n "$apt_updated" ] || { apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  apt_install "${need_pkgs[@]}"
fi
if ! command -v chromium >/dev/null; then  # a real browser for the dashboard's test (driven by Playwright)
  log "installing chromium"
  apt_install --no-install-recommends chromium
fi
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then  # the aggregator's PostgreSQL tests run a private server
  log "installing postgresql"
  apt_install --no-install-recommends postgresql
fi
if ! command -v promtool >/dev/null; then  # promtool, for the alert rules' tests (no node exporter)
  log "installing prometheus (promtool)"
  apt_install --no-install-recommends prometheus
fi

# gVisor needs its own --network=none here (no netns setup for sandboxes): see docs/ARCHITECTURE.md.
mkdir -p /etc/docker
want='{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}}'
if [ ! -f /etc/docker/daemon.json ] || ! grep -q '"runsc"' /etc/docker/daemon.json; then
  if [ -f /etc/docker/daemon.json ] && [ -s /etc/docker/daemon.json ]; then
    python3 - "$want" <<'PY'
import json, sys
path = "/etc/docker/daemon.json"
cfg = json.load(open(path))
cfg.setdefault("runtimes", {}).update(json.loads(sys.argv[1])["runtimes"])
json.dump(cfg, open(path, "w"), indent=2)
PY
  else
    echo "$want" > /etc/docker/daemon.json
  fi
  if [ -S /var/run/docker.sock ] && pidof dockerd >/dev/null; then kill -HUP "$(pidof dockerd)"; sleep 1; fi
fi

if ! docker info >/dev/null 2>&1; then
  if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
    log "starting docker.service"
    systemctl start docker
  else
    log "starting dockerd in the background (log: /var/log/rlsandbox-dockerd.log)"
    nohup dockerd >/var/log/rlsandbox-dockerd.log 2>&1 &
  fi
  for _ in $(seq 1 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  docker info >/dev/null 2>&1 || { log "dockerd did not come up; see /var/log/rlsandbox-dockerd.log"; exit 1; }
fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.rlsandbox-deps
deps_hash=$(cat requirements-dev.txt client/pyproject.toml daemon/pyproject.toml loadtest/pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$deps_hash" ]; then
  log "installing Python dependencies"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -r requirements-dev.txt
  .venv/bin/pip install -q --no-deps -e client -e daemon -e loadtest
  echo "$deps_hash" > "$stamp"
fi

log "building sandbox images (skipped when up to date)"
.venv/bin/rlsandbox --log-level WARNING images build ${RLSANDBOX_IMAGES:-}
log "ready: $ROOT"
