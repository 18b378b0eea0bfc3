"""Verified recycling: a sandbox serves the next episode only once its agent proved it as clean as
a new one. The previous episode plays a policy trying to leave something behind for the next;
the next episode, in the same container, finds nothing."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from collections.abc import AsyncIterator

import pytest
from helpers import BUSYBOX, PYTHON, commands_through_a_stop_loop, daemon_config, running_daemon
from rlsandbox.client import AsyncClient, AsyncSession
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.grading.task import tar_files
from rlsandbox.daemon.model import ExecRequest
from rlsandbox.daemon.sandbox import Sandbox
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

# Everything a policy might try to leave for the next episode, from inside, as the episode's user.
LEAVE_BEHIND = r"""
import ctypes, fcntl, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
# SysV IPC: shared memory, a semaphore set, a message queue (they outlive processes).
assert libc.shmget(0x5eed, 4096, 0o1000 | 0o600) >= 0, "shmget"
assert libc.semget(0x5eee, 1, 0o1000 | 0o600) >= 0, "semget"
assert libc.msgget(0x5eef, 0o1000 | 0o600) >= 0, "msgget"
# A POSIX message queue (/dev/mqueue) and POSIX shared memory (/dev/shm).
rt = ctypes.CDLL("librt.so.1", use_errno=True)
assert rt.mq_open(b"/leftover", os.O_CREAT | os.O_RDWR, 0o600, None) >= 0, "mq_open"
open("/dev/shm/leftover", "w").write("x")
# Files in every writable place, hidden and nested.
for path in ("/tmp/leftover", "/tmp/.hidden", os.path.expanduser("~/.profile_evil"), "/workspace/leftover",
             "/workspace/deep/er/f", "/workspace/.git/hooks/post-checkout"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").write("left by the previous episode")
os.symlink("/etc/passwd", "/workspace/link-out")
# A file lock held by a daemonized, double-forked grandchild that ignores SIGTERM/SIGHUP and
# rewrites its marker forever (a cron-like loop), under a name that looks like the agent's.
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        lock = open("/tmp/lockfile", "w")
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            open("/proc/self/comm", "w").write("agent.py")
        except OSError:
            pass
        while True:
            try:
                open("/tmp/cron.log", "a").write("alive\n")
            except OSError:
                pass
            time.sleep(0.02)
    os._exit(0)
# A background sleeper in its own session, as a shell would leave it.
subprocess.Popen(["sleep", "1000"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
# Places it must not be able to write at all (read-only root, root-owned mounts, the agent).
denied = []
for path in ("/etc/evil", "/usr/lib/evil", "/var/tmp/evil", "/evil", "/root/evil", "/.rlsandbox/agent.py",
             "/etc/hosts", "/etc/resolv.conf"):
    try:
        open(path, "a").write("x")
    except OSError:
        denied.append(path)
try:
    os.kill(1, 9)
except OSError:
    denied.append("kill 1")
print(",".join(denied))
"""

FIND_LEFTOVERS = r"""
import os
out = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) not in (1, os.getpid(), os.getppid()):
        try:
            out.append("process %s: %s" % (pid, open("/proc/%s/cmdline" % pid).read().replace("\0", " ")))
        except OSError:
            pass
for place in ("/tmp", "/dev/shm", "/dev/mqueue", "/workspace", os.path.expanduser("~")):
    for name in os.listdir(place):
        out.append("file %s/%s" % (place, name))
for table in ("shm", "sem", "msg"):
    rows = open("/proc/sysvipc/" + table).read().splitlines()[1:]
    out += ["ipc %s: %s" % (table, r.split()[:2]) for r in rows]
print("\n".join(out))
"""


@pytest.fixture(scope="module")
async def node(images: dict[str, str]) -> AsyncIterator[NodeDaemon]:
    pools = [
        PoolConfig(
            name="recycled", image=PYTHON, min_ready=1, max_total=1, read_only_root=True, recycle=True, max_reuses=3,
            memory_mb=256, pids=128,
        ),
        # No ``recycle``: the default ("auto") recycles a pool that qualifies, and only while its
        # image runs the agent (busybox has no python3).
        PoolConfig(name="auto", image=PYTHON, min_ready=1, max_total=1, read_only_root=True, memory_mb=128, pids=64),
        PoolConfig(name="auto-no-agent", image=BUSYBOX, min_ready=1, max_total=1, read_only_root=True, memory_mb=64, pids=64),
    ]  # fmt: skip
    async with running_daemon(daemon_config(pools=pools)) as daemon:
        yield daemon


async def _container(s: AsyncSession) -> str:
    return (await s.exec("cat /etc/hostname")).stdout.decode().strip()


async def test_the_next_episode_finds_nothing_the_previous_one_left(node: NodeDaemon) -> None:
    async with AsyncClient(node.address, timeout=60) as client:
        first = await client.create_session("recycled")
        container = await _container(first)
        assert (await first.exec("id -u")).stdout == b"1000\n"  # the episode is not root
        planted = await first.exec(["python3", "-c", LEAVE_BEHIND], timeout=30)
        assert planted.exit_code == 0, planted.stderr_text
        denied = planted.stdout_text.strip().split(",")
        assert set(denied) == {
            "/etc/evil", "/usr/lib/evil", "/var/tmp/evil", "/evil", "/root/evil", "/.rlsandbox/agent.py",
            "/etc/hosts", "/etc/resolv.conf", "kill 1",
        }, denied  # fmt: skip
        assert (await first.exec("export EVIL=1; cd /tmp", shell_session="main")).exit_code == 0
        await asyncio.sleep(0.2)
        assert b"alive" in (await first.exec("cat /tmp/cron.log")).stdout
        assert await first.close()

        second = await client.create_session("recycled", acquire_timeout=30)
        assert await _container(second) == container, "max_total = 1: the next episode must get the same sandbox"
        await asyncio.sleep(0.2)  # a survivor would have rewritten its marker by now
        leftovers = await second.exec(["python3", "-c", FIND_LEFTOVERS])
        assert leftovers.exit_code == 0 and leftovers.stdout_text.strip() == "", leftovers.stdout_text
        assert (await second.exec("echo ${EVIL:-clean}; pwd", shell_session="main")).stdout == b"clean\n/workspace\n"
        assert (await second.exec("id -u")).stdout == b"1000\n"
        # The agent is the one that started the container, and it keeps working.
        await second.write_files({"/workspace/mine.txt": "new episode"})
        assert (await second.exec("ls -l /workspace/mine.txt")).stdout_text.split()[2] in ("1000", "?")
        await second.close()
        stats = next(p for p in node.pools.values() if p.name == "recycled").stats()
        assert stats.recycled_total >= 1 and stats.recycle_failures_total == 0


WORKDIR_STATE = (
    "import os\nst = os.stat('/workspace')\n"
    "print(oct(st.st_mode & 0o7777), sorted(n for n in os.listxattr('/workspace') if not n.startswith('security.')))\n"
)


async def test_the_next_episode_gets_the_workdir_as_it_was_made(node: NodeDaemon) -> None:
    """The episode's user owns the workdir: it emptied fine, but its mode and extended attributes
    (an ACL is one) stayed for the next episode (issue 46). A reset puts them back as the sandbox
    started and checks them; a sandbox where it cannot is destroyed."""
    async with AsyncClient(node.address, timeout=60) as client:
        first = await client.create_session("recycled")
        container = await _container(first)
        made = (await first.exec(["python3", "-c", WORKDIR_STATE])).stdout_text
        changed = await first.exec(
            ["python3", "-c", "import os\nos.chmod('/workspace', 0o777)\n"
             "try:\n    os.setxattr('/workspace', 'user.rlsandbox-planted', b'x')\n"
             "except OSError as e:\n    print('no xattr', e)\n" + WORKDIR_STATE]
        )  # fmt: skip
        assert changed.exit_code == 0 and "0o777" in changed.stdout_text, changed.stdout_text + changed.stderr_text
        await first.close()
        second = await client.create_session("recycled", acquire_timeout=30)
        assert await _container(second) == container
        assert (await second.exec(["python3", "-c", WORKDIR_STATE])).stdout_text == made
        await second.close()


async def test_a_sandbox_is_destroyed_after_max_reuses(node: NodeDaemon) -> None:
    async with AsyncClient(node.address, timeout=60) as client:
        seen = []
        for _ in range(6):
            async with client.session("recycled", acquire_timeout=60) as s:
                seen.append(await _container(s))
        # max_reuses = 3: one sandbox serves at most 4 episodes (its first and three recycled).
        runs = [len(list(g)) for _, g in __import__("itertools").groupby(seen)]
        assert max(runs) <= 4 and len(set(seen)) >= 2, seen


async def test_a_pool_that_qualifies_recycles_by_default_unless_its_image_runs_no_agent(node: NodeDaemon) -> None:
    async with AsyncClient(node.address, timeout=60) as client:
        for pool, recycled in (("auto", True), ("auto-no-agent", False)):
            seen = []
            for _ in range(3):
                async with client.session(pool, acquire_timeout=60) as s:
                    seen.append(await _container(s))
                    user = (await s.exec("id -u")).stdout
            # The agent runs the episode's commands as uid 1000; without it they run as root.
            assert user == (b"1000\n" if recycled else b"0\n"), (pool, user)
            stats = node.pools[pool].stats()
            assert (len(set(seen)) == 1) is recycled, (pool, seen)
            assert (stats.recycled_total >= 2) is recycled and stats.recycle_failures_total == 0, (pool, stats)


def notes_task(task_id: str) -> dict[str, object]:
    """A task of the recycling pool, solved by writing "fixed" into notes.txt."""
    return {
        "id": task_id,
        "pool": "recycled",
        "workspace": {"source": "bundle", "path": "/workspace"},
        "evaluation": {"test_command": "grep -q fixed notes.txt", "report_format": "exit-code"},
    }


async def test_a_task_workspace_belongs_to_the_episodes_user(node: NodeDaemon) -> None:
    """Tasks run in recycling pools too: their workspace is extracted owned by the episode's user,
    who can edit it (grading there: every attack of test_reward_hacks.py runs in such a pool; this
    pool's single sandbox leaves no room for a clean room)."""
    task = notes_task("t1")
    tar = tar_files({"notes.txt": "todo\n", "pkg/mod.py": "x = 1\n"})
    async with AsyncClient(node.address, timeout=60) as client, client.session(task=(json.dumps(task), tar)) as s:
        owners = await s.exec("stat -c '%u %n' notes.txt pkg pkg/mod.py")
        assert owners.stdout_text.split("\n")[:3] == ["1000 notes.txt", "1000 pkg", "1000 pkg/mod.py"], owners.stdout_text
        assert (await s.exec("echo fixed > notes.txt && echo y > pkg/new.py")).exit_code == 0


async def test_a_tasks_next_sessions_get_its_reset_workspace_without_git_running_again(node: NodeDaemon) -> None:
    """The first session of a task on an image runs the git reset; the next ones extract what it
    made (.git included): the same base commit, a clean and refreshed index, files the episode's
    own, and nothing an earlier episode committed or wrote."""
    task = notes_task("t-based")
    # Content no other test uses: the cache is keyed by content, not by task id.
    tar = tar_files({"notes.txt": "todo\n", "pkg/based.py": "x = 1\n"})
    look = (
        "git rev-parse HEAD; git log --oneline | wc -l; git status --porcelain; git diff-files --name-only;"
        " stat -c '%u' .git/index notes.txt; cat notes.txt"
    )
    workspaces = node.grader.workspaces
    hits = workspaces.based_hits
    seen = []
    async with AsyncClient(node.address, timeout=60) as client:
        for _ in range(3):
            async with client.session(task=(json.dumps(task), tar), acquire_timeout=60) as s:
                seen.append((await s.exec(look)).stdout_text)
                # The episode commits and changes files: none of it may reach the next session.
                done = await s.exec("echo fixed > notes.txt && git add -A && git -c user.name=a -c user.email=a@b commit -qm x")
                assert done.exit_code == 0, done.stderr_text
    head, commits, *rest = seen[0].split("\n")
    assert len(head) == 40 and commits == "1" and rest[:3] == ["1000", "1000", "todo"], seen[0]  # clean: no status lines
    assert seen == [seen[0]] * 3, seen
    assert workspaces.based_hits == hits + 2


async def test_what_an_episode_leaves_never_reaches_a_tasks_kept_reset_workspace(node: NodeDaemon) -> None:
    """The reset workspace a task's next sessions extract is read from the first sandbox prepared
    for the task: in a recycling pool, one where an earlier episode planted files (a git hook among
    them) and processes. What is kept holds the task's files and the reset's .git, nothing else."""
    files = {"notes.txt": "todo\n", "pkg/kept.py": "x = 2\n"}  # content no other test uses
    tar = tar_files(files)
    async with AsyncClient(node.address, timeout=60) as client:
        for _ in range(5):  # a sandbox with 3 episodes left before max_reuses: the planter's and the task's two
            planter = await client.create_session("recycled", acquire_timeout=60)
            if node.sessions.get(planter.id).sandbox.reuses <= 1:  # type: ignore[union-attr]
                break
            await planter.close()
        container = await _container(planter)
        planted = await planter.exec(["python3", "-c", LEAVE_BEHIND], timeout=30)
        assert planted.exit_code == 0, planted.stderr_text
        await planter.close()
        for _ in range(2):  # the first makes and keeps the reset workspace, the second extracts it
            async with client.session(task=(json.dumps(notes_task("t-kept")), tar), acquire_timeout=60) as s:
                assert await _container(s) == container
                listed = await s.exec("find . -path ./.git -prune -o -print | sort; ls .git/hooks | grep -v sample")
                assert listed.stdout_text.split() == [".", "./notes.txt", "./pkg", "./pkg/kept.py"], listed.stdout_text
    [(_, kept, _)] = [v for v in node.grader.workspaces._based.values() if v[0] == tar]
    with tarfile.open(fileobj=io.BytesIO(kept)) as t:
        names = sorted(n for n in t.getnames() if not n.startswith("./.git/"))
        hooks = [n for n in t.getnames() if n.startswith("./.git/hooks/") and not n.endswith(".sample")]
    assert names == [".", "./.git", "./notes.txt", "./pkg", "./pkg/kept.py"] and hooks == [], (names, hooks)


async def test_a_fork_bomb_running_at_close_is_ended_by_the_reset(node: NodeDaemon) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    async with AsyncClient(node.address, timeout=60) as client:
        first = await client.create_session("recycled", acquire_timeout=60)
        container = await _container(first)
        failures = node.pools["recycled"].stats().recycle_failures_total
        sandbox = node.sessions.get(first.id).sandbox  # type: ignore[union-attr]
        worn = sandbox is not None and sandbox.reuses >= 3  # max_reuses: destroyed whatever the reset finds
        await first.write_files({"/tmp/bomb.py": bomb})
        assert (await first.exec("nohup python3 /tmp/bomb.py >/dev/null 2>&1 &")).exit_code == 0
        await asyncio.sleep(0.5)  # the sandbox is at its pids limit now
        await first.close()
        async with client.session("recycled", acquire_timeout=60) as second:
            leftovers = await second.exec(["python3", "-c", FIND_LEFTOVERS])
            assert leftovers.stdout_text.strip() == "", leftovers.stdout_text
            # Recycled when the reset proved it clean, destroyed otherwise: never a dirty hand-out.
            pool = node.pools["recycled"].stats()
            assert (await _container(second) == container) == (not worn and pool.recycle_failures_total == failures)


async def test_the_daemons_own_commands_run_out_of_the_episodes_reach(node: NodeDaemon) -> None:
    """The grader reads a recycling pool's workspaces with the sandbox's tar run as the agent's
    user: the episode's processes (uid 1000) can neither kill nor trace it, and the API cannot ask
    for it."""
    async with AsyncClient(node.address, timeout=60) as client, client.session("recycled", acquire_timeout=60) as s:
        sandbox = node.sessions.get(s.id).sandbox  # type: ignore[union-attr]
        assert sandbox is not None
        mine = await sandbox.exec(ExecRequest(argv=("id", "-u"), as_root=True))
        assert mine.stdout == b"0\n"
        assert (await sandbox.exec(ExecRequest(argv=("id", "-u")))).stdout == b"1000\n"
        # A root command lives through the episode's kill -9 -1 and a ptrace attach.
        sleeper = asyncio.ensure_future(sandbox.exec(ExecRequest(shell="sleep 2; echo survived", as_root=True, timeout=20)))
        await asyncio.sleep(0.5)
        attack = (
            "import ctypes, os, signal\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "pids = [int(p) for p in os.listdir('/proc') if p.isdigit() and open(f'/proc/{p}/comm').read().strip() == 'sleep']\n"
            "traced = [libc.ptrace(16, p, 0, 0) for p in pids]  # PTRACE_ATTACH\n"
            "print(len(pids), traced, ctypes.get_errno(), flush=True)\n"
            "os.kill(-1, signal.SIGKILL)\n"
        )
        tried = await s.exec(["python3", "-c", attack])
        found, traced = tried.stdout_text.split(" ", 1)
        assert found == "1" and traced.startswith("[-1]"), tried.stdout_text
        assert (await sleeper).stdout == b"survived\n"
        # A bounded read ends the command at its cap instead of waiting for it.
        endless = await sandbox.exec(ExecRequest(argv=("yes",), stdout_cap=4096, cap_kills=True, as_root=True, timeout=30))
        assert endless.stdout_truncated and len(endless.stdout) == 4096 and not endless.timed_out


# Runs in the background of an episode while its commands start: whenever a thread of the agent
# (PID 1) holds the episode's user's ids to start one (agent/sandbox_agent.py, _Spawner), it tries
# what a process of that user could then do to it, through that thread's id and through PID 1.
# Writes what it saw to /tmp/window.json.
WINDOW_ATTACK = r"""
import ctypes, json, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
seen = {"windows": 0, "term": 0, "ptrace": 0, "mem": 0, "oom": 0, "nice": 0, "idle": 0, "cpus": 0, "main": 0}
def attempt(name, fn):
    try:
        if fn() is not False:
            seen[name] += 1
    except OSError as e:
        seen.setdefault("errors", {})[name] = str(e)
def uid(tid):
    status = open("/proc/1/task/%s/status" % tid).read()
    return next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1]
end = time.monotonic() + float(os.environ["SECONDS_"])
tids = []
while time.monotonic() < end and seen["windows"] < 200:
    try:
        tid = next(t for t in tids if uid(t) != "0")
    except (StopIteration, OSError):
        tids = os.listdir("/proc/1/task")  # the agent's threads: a retired spawner's successor is new
        continue
    seen["windows"] += 1
    t = int(tid)
    attempts = [
        ("term", lambda: os.kill(t, signal.SIGTERM)),  # a thread's id signals the whole process
        ("ptrace", lambda: libc.ptrace(16, t, 0, 0) == 0),  # PTRACE_ATTACH
        ("mem", lambda: open("/proc/1/task/%d/mem" % t, "rb").close()),
        ("oom", lambda: open("/proc/1/oom_score_adj", "w").write("1000")),
        ("nice", lambda: os.setpriority(os.PRIO_PROCESS, t, 19)),
        ("idle", lambda: os.sched_setscheduler(t, os.SCHED_IDLE, os.sched_param(0))),
        ("cpus", lambda: os.sched_setaffinity(t, {min(os.sched_getaffinity(0))})),
        ("main", lambda: [os.setpriority(os.PRIO_PROCESS, 1, 19), os.kill(1, signal.SIGTERM)]),  # root throughout
    ]
    first = seen["windows"] % len(attempts)  # each attack goes first in turn: a window is short
    for name, fn in attempts[first:] + attempts[:first]:
        attempt(name, fn)
json.dump(seen, open("/tmp/window.json", "w"))
"""


async def _none_left(sandbox: Sandbox, marker: bytes, seconds: float = 5.0) -> bool:
    """Whether no process whose command line holds ``marker`` is left within ``seconds``."""
    for _ in range(int(seconds / 0.1)):
        ps = await sandbox.exec(ExecRequest(argv=("ps", "-eo", "args"), as_root=True))
        if ps.exit_code == 0 and marker not in ps.stdout:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_recycling_rooms_last_command_ends_the_users_processes_and_spares_the_daemons(node: NodeDaemon) -> None:
    """In a sandbox whose commands run as uid 1000 (a recycling clean room), ``end_leftovers``
    ends what the user's command left and nothing of root's: the daemon's own commands (and the
    warm interpreters) run on."""
    async with AsyncClient(node.address, timeout=60) as client, client.session("recycled", acquire_timeout=60) as s:
        sandbox = node.sessions.get(s.id).sandbox  # type: ignore[union-attr]
        assert sandbox is not None
        sleeper = asyncio.ensure_future(sandbox.exec(ExecRequest(shell="sleep 2; echo survived", as_root=True, timeout=20)))
        await asyncio.sleep(0.3)
        left = "setsid sh -c 'sleep 30; :' >/dev/null 2>&1 & (trap '' TERM; sleep 31; :) >/dev/null 2>&1 & echo done"
        ended = await sandbox.exec(ExecRequest(shell=left, timeout=20, end_leftovers=True))
        assert ended.stdout == b"done\n" and ended.ended >= 2, (ended.ended, ended.ended_names)
        assert any("sleep 30" in n for n in ended.ended_names) and any("sleep 31" in n for n in ended.ended_names)
        assert await _none_left(sandbox, b"sleep 3"), "a process the command left outlived it"
        assert (await sleeper).stdout == b"survived\n"


async def test_a_fork_bomb_the_last_command_leaves_is_ended_with_it(node: NodeDaemon) -> None:
    """A test run that leaves a fork bomb at the sandbox's pids limit: ending it needs no fork of
    the agent's (none is left to make), the agent answers, and nothing of the bomb is left."""
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    async with AsyncClient(node.address, timeout=60) as client, client.session("recycled", acquire_timeout=60) as s:
        sandbox = node.sessions.get(s.id).sandbox  # type: ignore[union-attr]
        assert sandbox is not None
        await s.write_files({"/tmp/bomb.py": bomb})
        left = "nohup python3 /tmp/bomb.py >/dev/null 2>&1 & sleep 0.5; echo done"
        ended = await sandbox.exec(ExecRequest(shell=left, timeout=30, end_leftovers=True))
        assert ended.stdout == b"done\n" and ended.ended > 10, (ended.ended, ended.ended_names)
        assert all("bomb.py" in name for name in ended.ended_names), ended.ended_names
        # Hundreds killed at once take a moment to finish exiting; a live bomb would never be gone.
        assert await _none_left(sandbox, b"bomb.py"), "the bomb outlived the command that left it"


async def test_the_agent_starts_user_commands_with_their_ids_out_of_their_reach(node: NodeDaemon) -> None:
    """A recycling sandbox's agent starts the episode's commands with posix_spawn from a thread
    that holds the user's real and effective ids for the moment (no fork of the agent per
    command), keeping root's saved ids; the agent's main thread stays root. A command is the
    user's through and through; the episode's own processes, trying all the while, can neither
    stop, trace nor read the agent, and what they change of that thread's scheduling dies with it:
    the next episode's agent has none of it."""
    async with AsyncClient(node.address, timeout=60) as client:
        s = await client.create_session("recycled", acquire_timeout=60)
        container = await _container(s)
        status = (await s.exec("cat /proc/self/status")).stdout_text
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        assert fields["Uid"].split() == ["1000"] * 4 and fields["Gid"].split() == ["1000"] * 4, status
        assert fields["Groups"].strip() == "", status
        for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
            assert int(fields[cap], 16) == 0, status
        agent_before = (await s.exec("cat /proc/1/status")).stdout_text
        attacker = asyncio.ensure_future(s.exec(["python3", "-c", WINDOW_ATTACK], env={"SECONDS_": "20"}, timeout=40))
        commands = 0
        while not attacker.done():
            assert (await s.exec("true")).exit_code == 0  # the agent lives through every attempt
            commands += 1
        assert (await attacker).exit_code == 0, attacker.result().stderr_text
        seen = json.loads((await s.exec("cat /tmp/window.json")).stdout)
        assert seen["windows"] > 0, (seen, commands)  # a thread took the user's ids (the fast path ran)
        assert seen["ptrace"] == seen["mem"] == seen["oom"] == seen["main"] == 0, seen
        agent = dict(line.split(":", 1) for line in (await s.exec("cat /proc/1/status")).stdout_text.splitlines() if ":" in line)
        before = dict(line.split(":", 1) for line in agent_before.splitlines() if ":" in line)
        assert agent["Uid"].split() == ["0"] * 4 and agent["Cpus_allowed_list"] == before["Cpus_allowed_list"], agent
        sandbox = node.sessions.get(s.id).sandbox  # type: ignore[union-attr]
        worn = sandbox is not None and sandbox.reuses >= 3  # max_reuses: destroyed whatever the reset finds
        await s.close()
        async with client.session("recycled", acquire_timeout=60) as s2:
            assert (await _container(s2) == container) == (not worn), (seen, worn)
            # Every thread of the agent (the spawner that started this very command among them):
            # nice 0, the default policy, the CPU set the agent started with.
            script = "for t in /proc/1/task/*; do cat $t/stat; grep Cpus_allowed_list $t/status; done"
            lines = (await s2.exec(script)).stdout_text.splitlines()
            assert len(lines) >= 4, lines  # the main thread and the spawner
            for stat, cpus in zip(lines[::2], lines[1::2], strict=True):
                after_comm = stat.rsplit(")", 1)[1].split()
                assert (after_comm[16], after_comm[38]) == ("0", "0"), (stat, seen)  # nice, policy
                assert cpus.split(":", 1)[1] == before["Cpus_allowed_list"], (cpus, seen)


async def test_an_episode_stopping_its_own_processes_never_freezes_the_agent(node: NodeDaemon) -> None:
    """`kill -STOP -1` in a loop stops a command's process between its start and its exec (it is
    the user's from its start): the agent's spawner thread waits, its main thread kills that
    process and answers throughout; the sandbox is reset and serves the next episode."""
    async with AsyncClient(node.address, timeout=60) as client:
        s = await client.create_session("recycled", acquire_timeout=60)
        container = await _container(s)
        seen = await commands_through_a_stop_loop(s)
        assert seen["commands"] > 0, seen
        sandbox = node.sessions.get(s.id).sandbox  # type: ignore[union-attr]
        worn = sandbox is not None and sandbox.reuses >= 3
        failures = node.pools["recycled"].stats().recycle_failures_total
        await s.close()
        async with client.session("recycled", acquire_timeout=60) as s2:
            assert (await _container(s2) == container) == (not worn), seen
            assert node.pools["recycled"].stats().recycle_failures_total == failures
            assert (await s2.exec("echo fresh")).stdout == b"fresh\n"
