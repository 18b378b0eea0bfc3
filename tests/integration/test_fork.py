"""Fork through the API on real containers: each fork's filesystem equals the source's at the
call (workspace and everything else it changed: new, changed and deleted files, modes, owners,
symlinks, a folder of many files), forks are independent of each other and of the source,
processes are not copied, a task is carried over so each fork is graded on its own work, a
read-only-root pool's workspace volume comes along, and errors are typed with nothing leaked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import daemon_config, running_daemon
from rlsandbox.client import AsyncClient, AsyncSession, FailedPreconditionError, InvalidArgumentError, NotFoundError
from rlsandbox.daemon.agent.socket_transport import DROP_BUDGET, STAGE_PREFIX, Drop
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.errors import FileTooLarge
from rlsandbox.daemon.grading.task import load_tasks
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parent.parent / "fixtures" / "tasks"
PYTHON = "rlsandbox/python-task:latest"
# What a fork must see exactly as the source left it: content, mode, owner and kind of each path.
FINGERPRINT = (
    "cd / && for p in /workspace/notes.txt /workspace/run.sh /workspace/tree /workspace/link /etc/motd-mine "
    "/usr/local/lib/extra/mod.py /home/owned.txt; do "
    'if [ -L $p ]; then echo "$p link $(readlink $p)"; '
    "elif [ -d $p ]; then echo \"$p dir $(stat -c '%a %u' $p) $(find $p -type f | sort | xargs cat | sha256sum)\"; "
    "else echo \"$p file $(stat -c '%a %u' $p) $(sha256sum < $p)\"; fi; done; "
    "test -e /etc/issue && echo issue-present || echo issue-deleted"
)


@pytest.fixture(scope="module")
async def fork_daemon(images: dict[str, str]) -> AsyncIterator[NodeDaemon]:
    pools = [
        PoolConfig(name="python", image=PYTHON, min_ready=4, max_total=24),
        PoolConfig(name="ro", image=PYTHON, min_ready=2, max_total=8, read_only_root=True, memory_mb=256, pids=128),
    ]
    async with running_daemon(daemon_config(pools=pools, max_fork_bytes=4 << 20)) as node:
        yield node


@pytest.fixture
async def fclient(fork_daemon: NodeDaemon) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(fork_daemon.address, timeout=60) as c:
        yield c


async def shape(s: AsyncSession) -> str:
    r = await s.exec(FINGERPRINT)
    assert r.exit_code == 0, r.stderr_text
    return r.stdout_text


async def test_forks_equal_the_source_and_then_go_their_own_way(fclient: AsyncClient, fork_daemon: NodeDaemon) -> None:
    async with fclient.session("python", labels={"run": "fork-test"}) as src:
        setup = (
            "set -e; cd /workspace; printf 'hello\\n' > notes.txt; printf '#!/bin/sh\\necho run\\n' > run.sh; chmod 750 run.sh; "
            "mkdir -p tree/a tree/b; for i in $(seq 1 40); do echo $i > tree/a/f$i; echo $i$i > tree/b/g$i; done; "
            "ln -s notes.txt link; echo mine > /etc/motd-mine; rm /etc/issue; "
            "mkdir -p /usr/local/lib/extra; echo 'X = 1' > /usr/local/lib/extra/mod.py; "
            "echo owned > /home/owned.txt; chown 1000:1000 /home/owned.txt; "
            "(sleep 1000 &) ; echo started"
        )
        r = await src.exec(setup)
        assert r.exit_code == 0, r.stderr_text
        before = await shape(src)
        assert "issue-deleted" in before and "link notes.txt" in before and "750 0" in before and "644 1000" in before

        forks = await src.fork(3, labels={"branch": "x"})
        try:
            assert len(forks) == 3 and len({f.id for f in forks}) == 3 and src.id not in {f.id for f in forks}
            shapes = await asyncio.gather(*(shape(f) for f in forks))
            assert all(s == before for s in shapes), (before, shapes)
            for f in forks:
                assert f.info.labels == {"run": "fork-test", "branch": "x"}
                containers = {fork_daemon.sessions.sessions[x.id].sandbox.name for x in (src, f)}  # type: ignore[union-attr]
                assert f.info.pool == "python" and len(containers) == 2  # its own sandbox
                # The changes reached it as a file dropped in its host folder (no copy through its
                # agent), and nothing of that is left there.
                sandbox = fork_daemon.sessions.sessions[f.id].sandbox
                assert sandbox is not None and sandbox.takes_drops and sandbox.host_folder is not None
                assert sorted(p.name for p in sandbox.host_folder.iterdir() if p.name.startswith("drop-")) == []
                assert [p for p in sandbox.host_folder.parent.iterdir() if p.name.startswith(STAGE_PREFIX)] == []
                assert Drop.budget_left == DROP_BUDGET
                # Processes are not copied: the source's sleep runs only in the source.
                assert (await f.exec("pgrep -x sleep || echo none")).stdout_text.strip() == "none"
                assert (await f.exec("/workspace/run.sh")).stdout_text == "run\n"
            # Independent: what one fork writes, no other fork and not the source sees.
            await forks[0].exec("echo changed > /workspace/notes.txt && rm -r /workspace/tree")
            assert (await forks[1].exec("cat /workspace/notes.txt")).stdout_text == "hello\n"
            assert (await src.exec("cat /workspace/notes.txt; ls /workspace/tree")).stdout_text == "hello\na\nb\n"
            # A fork of a fork carries the fork's own changes.
            [grandchild] = await forks[0].fork(1)
            try:
                assert (await grandchild.exec("cat /workspace/notes.txt; test -e /workspace/tree || echo gone")).stdout_text == (
                    "changed\ngone\n"
                )
            finally:
                await grandchild.close()
        finally:
            for f in forks:
                await f.close()
    listed = [s for s in fork_daemon.sessions.sessions.values() if s.options.labels.get("run") == "fork-test"]
    assert listed == []


async def test_past_the_nodes_drop_budget_a_fork_gets_its_changes_through_stdin(
    fclient: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Drop, "budget_left", 0)  # as if other forks held the whole budget
    async with fclient.session("python") as src:
        assert (await src.exec("mkdir -p /workspace/big && head -c 300000 /dev/urandom > /workspace/big/blob")).exit_code == 0
        digest = (await src.exec("sha256sum /workspace/big/blob")).stdout_text
        forks = await src.fork(2)
        try:
            for f in forks:
                assert (await f.exec("sha256sum /workspace/big/blob")).stdout_text == digest
        finally:
            for f in forks:
                await f.close()
    assert Drop.budget_left == 0


async def test_each_fork_of_a_task_session_is_graded_on_its_own_work(fclient: AsyncClient) -> None:
    task = {t.id: t for t in load_tasks(TASKS)}["py-calc"]
    async with fclient.session(task=task) as src:
        src_code = (await src.read_files(["calc/__init__.py"]))["calc/__init__.py"].data.decode()
        await src.write_files({"notes.md": "thinking\n"})
        good, bad = await src.fork(2)
        try:
            fixed = src_code.replace("def multiply(a, b):\n    return a + b\n", "def multiply(a, b):\n    return a * b\n")
            await good.write_files({"calc/__init__.py": fixed})
            await bad.exec("echo 'def multiply(a, b): return 0' >> calc/__init__.py")
            assert good.info.task_id == "py-calc" and bad.info.task_id == "py-calc"
            g, b = await asyncio.gather(good.grade(), bad.grade())
            assert g.status == "ok" and g.reward == 1.0, g.message
            assert b.status == "ok" and b.reward == 0.0 and not b.resolved
            assert (await src.grade()).reward == 0.0  # the source's own work: unsolved
        finally:
            await good.close()
            await bad.close()


async def test_a_read_only_root_pools_workspace_volume_comes_along(fclient: AsyncClient) -> None:
    async with fclient.session("ro") as src:
        r = await src.exec("mkdir -p sub && echo vol > sub/v.txt && chmod 600 sub/v.txt && ls -l sub/v.txt | cut -c1-10")
        assert r.exit_code == 0 and r.stdout_text.strip() == "-rw-------", r.stderr_text
        [f] = await src.fork(1)
        try:
            assert (await f.exec("cat sub/v.txt; stat -c %a sub/v.txt")).stdout_text == "vol\n600\n"
        finally:
            await f.close()


async def test_fork_errors_are_typed_and_leave_nothing_behind(fclient: AsyncClient, fork_daemon: NodeDaemon) -> None:
    with pytest.raises(NotFoundError):
        await fclient.fork("no-such-session", 2)
    async with fclient.session("python") as src:
        with pytest.raises(InvalidArgumentError, match="count must be 1 to 64"):
            await src.fork(0)
        with pytest.raises(InvalidArgumentError, match="count must be 1 to 64"):
            await src.fork(65)
        before = len(fork_daemon.sessions.sessions)
        await src.exec("head -c 6000000 /dev/urandom > /workspace/big.bin")
        with pytest.raises(FailedPreconditionError, match="over the fork limit of 4 MiB"):
            await src.fork(2)
        assert len(fork_daemon.sessions.sessions) == before  # no fork was left half made
        assert (await src.exec("true")).exit_code == 0  # the source goes on
        await src.exec("rm /workspace/big.bin")
        # Thousands of changes in scratch space are one tarball; scattered over a system folder
        # (one engine call each) they are refused before any call is made.
        await src.exec("mkdir -p /tmp/cache && cd /tmp/cache && for i in $(seq 1 3000); do echo $i > f$i; done")
        [f] = await src.fork(1)
        try:
            assert (await f.exec("ls /tmp/cache | wc -l")).stdout_text.strip() == "3000"
        finally:
            await f.close()
        await src.exec("cd /usr/local/share && for i in $(seq 1 4100); do echo $i > x$i; done")
        with pytest.raises(FailedPreconditionError, match=r"changed 41\d\d separate places outside its workspace"):
            await src.fork(1)


async def test_a_diff_too_long_to_read_is_refused_not_read_whole(fclient: AsyncClient, fork_daemon: NodeDaemon) -> None:
    """How long the engine's diff is, the sandbox decides (millions of files): the daemon reads it
    up to a bound (here shrunk to 4 KiB) and refuses the fork, instead of holding it all in memory."""
    async with fclient.session("python") as src:
        await src.exec("mkdir -p /opt/many && cd /opt/many && for i in $(seq 1 200); do : > f$i; done")
        sandbox = fork_daemon.sessions.sessions[src.id].sandbox
        assert sandbox is not None
        with pytest.raises(FileTooLarge, match="diff is over 4096 bytes"):
            await fork_daemon.runtime.changes(sandbox.container_id, max_bytes=4096)
        assert len(await fork_daemon.runtime.changes(sandbox.container_id)) > 200  # the bound, not the API, refused


async def test_a_fork_of_an_untouched_session_is_a_hand_out_and_of_a_changed_one_never(
    fclient: AsyncClient, fork_daemon: NodeDaemon
) -> None:
    """A GRPO group from a fresh task session: nothing has run in the source, so each fork is a
    new session of the task, handed out from its prefetched sandboxes with nothing copied, and
    equal to the source (workspace and base commit). Anything that may have changed a session
    (a write, a command, being a fork of a changed one) makes its forks copies again."""
    task = {t.id: t for t in load_tasks(TASKS)}["py-calc"]
    prefetcher, forker = fork_daemon.sessions.prefetcher, fork_daemon.sessions.forker
    assert forker is not None
    state = "cd /workspace && git rev-parse HEAD && git log --format=%ad | wc -l && sha256sum calc/__init__.py"
    snapshots = 0
    snapshot = forker.snapshot

    async def counted(*args: object, **kwargs: object) -> object:
        nonlocal snapshots
        snapshots += 1
        return await snapshot(*args, **kwargs)  # type: ignore[arg-type]

    forker.snapshot = counted  # type: ignore[method-assign]
    try:
        async with fclient.session(task=task) as early:  # prepared now, the others a second later or more
            # Untouched but not prefetched: copying its workspace once beats preparing the task in each.
            [twin] = await early.fork(1)
            assert snapshots == 1
            want = (await early.exec(state)).stdout_text
            assert (await twin.exec(state)).stdout_text == want
            await twin.close()
        await asyncio.sleep(1.1)
        info = await fclient.prefetch(task, 3, ttl=60)
        for _ in range(600):
            info = await fclient.prefetch(info, 3, ttl=60)
            if info.ready == 3:
                break
            await asyncio.sleep(0.05)
        assert info.ready == 3, info
        async with fclient.session(task=info) as src:
            code = (await src.read_files(["calc/__init__.py"]))["calc/__init__.py"].data  # a read changes nothing
            before = prefetcher.handed_out_total
            forks = await src.fork(2, labels={"group": "g"})
            try:
                assert snapshots == 1 and prefetcher.handed_out_total - before == 2  # hand-outs, nothing copied
                assert (await src.exec(state)).stdout_text == want
                for f in forks:
                    assert f.info.task_id == "py-calc" and f.info.labels.get("group") == "g"
                    assert (await f.exec(state)).stdout_text == want  # the same base commit, one commit of history
                    assert (await f.read_files(["calc/__init__.py"]))["calc/__init__.py"].data == code
                graded = await forks[0].grade()
                assert graded.status == "ok" and graded.reward == 0.0, graded.message
            finally:
                for f in forks:
                    await f.close()
            # The source has now run a command: its forks are copies of it.
            await src.write_files({"notes.md": "mine\n"})
            [copy] = await src.fork(1)
            try:
                assert snapshots == 2
                # A fork of a changed session is itself changed, though nothing ran in it since.
                [again] = await copy.fork(1)
                try:
                    assert snapshots == 3
                    assert (await again.exec("cat notes.md")).stdout_text == "mine\n"
                finally:
                    await again.close()
            finally:
                await copy.close()
        async with fclient.session("python") as plain:  # an untouched pool session: warm hand-outs
            [twin] = await plain.fork(1)
            await twin.close()
            assert snapshots == 3
            await plain.write_files({"a.txt": "a"})  # WriteFiles alone is a change
            [twin] = await plain.fork(1)
            try:
                assert snapshots == 4 and (await twin.exec("cat a.txt")).stdout_text == "a"
            finally:
                await twin.close()
    finally:
        forker.snapshot = snapshot  # type: ignore[method-assign]
        await fclient.prefetch(info, 0)


async def test_the_diff_walked_on_the_host_is_the_engines_and_forks_follow_it(
    fclient: AsyncClient, fork_daemon: NodeDaemon
) -> None:
    """The container's overlay layer walked by the daemon (runtime/overlay.py) gives the engine's
    own diff, path for path: new, changed and deleted files, links, owners, a folder deleted and
    made again (opaque: what the image had in it is gone in the forks too)."""
    async with fclient.session("python") as src:
        r = await src.exec(
            "set -e; mkdir -p /workspace/tree/a; echo 1 > /workspace/tree/a/f; ln -s tree /workspace/link; "
            "rm /etc/issue; echo mine > /etc/motd-mine; mkdir -p /usr/local/lib/extra; echo X > /usr/local/lib/extra/m.py; "
            "test -e /etc/apt/sources.list.d; rm -rf /etc/apt; mkdir /etc/apt; echo new > /etc/apt/only.txt; "
            "chmod 700 /opt; echo o > /home/owned.txt; chown 1000 /home/owned.txt"
        )
        assert r.exit_code == 0, r.stderr_text
        sandbox = fork_daemon.sessions.sessions[src.id].sandbox
        assert sandbox is not None
        info = await fork_daemon.runtime.inspect(sandbox.container_id)
        engine = await fork_daemon.runtime.changes(sandbox.container_id)
        walked = await fork_daemon.runtime.changes(sandbox.container_id, info=info)
        assert sorted(walked) == sorted(engine) and ("/etc/apt/sources.list.d", 2) in walked
        [f] = await src.fork(1)
        try:
            got = await f.exec("ls /etc/apt; test -e /etc/issue || echo no-issue; stat -c '%a' /opt; cat /workspace/link/a/f")
            assert got.stdout_text == "only.txt\nno-issue\n700\n1\n", got.stdout_text
        finally:
            await f.close()
