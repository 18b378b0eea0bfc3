"""rlsandbox in-sandbox agent: one stdlib-only file, Python >= 3.8.

The daemon starts this file as PID 1 of every sandbox whose image has python3 and talks to it over
the container's attached stdin/stdout, so that a command costs a fork/exec inside the sandbox
instead of a ``docker exec`` round trip through dockerd and runc.

Wire format (both directions), all integers big endian::

    magic "RX" | version u8 | kind u8 | request id u32 | meta length u32 | body length u32
    meta: UTF-8 JSON object | body: raw bytes

Many requests are in flight at once; every response frame carries the id of its request. A request
ends with exactly one RESULT or ERROR frame; EXEC may send STDOUT/STDERR chunks before it.

A keyed stream (the container's attach stream, which a root process in a gVisor sandbox can open
through /proc/1/fd): the daemon's first frame is KEY, bare, sent before anything in the sandbox
runs. From then on every frame, both ways, is followed by a 16-byte BLAKE2b tag under that key and
the frame's number in its direction: a frame written in by anyone else, or one read away (the next
one's number is then wrong), fails the check, and the stream counts as tampered with.

The framing half of this file (``encode_frame``, ``FrameDecoder``) is imported by the daemon too,
so both ends share one implementation.
"""

import errno
import fcntl
import hashlib
import hmac
import json
import os
import selectors
import signal
import stat as stat_mod
import struct
import subprocess
import sys
import threading
import time

PROTOCOL_VERSION = 1
AGENT_VERSION = "1.0"
MAGIC = b"RX"
HEADER = struct.Struct(">2sBBIII")
MAX_META = 1 << 20
MAX_BODY = 256 << 20

# Requests (daemon -> agent).
K_PING = 1
K_EXEC = 2
K_CANCEL = 3
K_WRITE_FILES = 4
K_READ_FILES = 5
K_LIST = 6
K_STAT = 7
K_SHELL_CLOSE = 8
K_SHUTDOWN = 9
K_RESET = 10  # recycling: end every process, wipe the writable places, prove the sandbox is clean
K_KEY = 11  # the first frame of a keyed stream: {"key": hex}; every later frame is tagged
# Responses (agent -> daemon).
K_STDOUT = 16
K_STDERR = 17
K_RESULT = 18
K_ERROR = 19

READ_CHUNK = 1 << 16
DIAL_MIN = 0.02  # seconds before dialling the daemon again after a failed attempt or a lost daemon
DIAL_MAX = 0.25  # ... doubling up to this: a restarted daemon finds every agent within it
DRAIN_GRACE = 0.1  # seconds to wait for pipe EOF after the command's main process exited
SHELL_KILL_GRACE = 1.0  # seconds a timed-out shell command gets before the whole shell is killed
SCRATCH = "/tmp/.rlsandbox"
TAG_SIZE = 16
TO_AGENT = b"rlsandbox:agent"  # BLAKE2b personalisation of each direction's tags
TO_DAEMON = b"rlsandbox:daemon"
EXIT_TAMPERED = 86  # the agent's exit status when its keyed stream was tampered with


class ProtocolError(Exception):
    """The byte stream is not a valid rlsandbox frame stream."""


class UnsupportedVersion(ProtocolError):
    """A well-formed frame of a protocol version this side does not speak."""

    def __init__(self, version, request_id):
        ProtocolError.__init__(self, "protocol version %d is not supported (this side speaks %d)" % (version, PROTOCOL_VERSION))
        self.version = version
        self.request_id = request_id


class Tampered(ProtocolError):
    """A keyed stream's frame failed its tag: something else wrote into the stream or read from it."""


class FrameSealer(object):
    """Tags one direction's frames of a keyed stream, numbering them from 0. A frame carries two
    tags: one right behind its header (its lengths are trusted only once that holds, so a forged
    header cannot make the reader swallow the real frames behind it), one behind its body."""

    __slots__ = ("_key", "_person", "_seq")

    def __init__(self, key, person):
        self._key = key
        self._person = person
        self._seq = 0

    def _mac(self, what):
        salt = struct.pack(">7xBQ", what, self._seq)
        return hashlib.blake2b(digest_size=TAG_SIZE, key=self._key, person=self._person, salt=salt)

    def head(self, header):
        h = self._mac(1)
        h.update(header)
        return h.digest()

    def tag(self, pieces):
        h = self._mac(2)
        for piece in pieces:
            h.update(piece)
        self._seq += 1
        return h.digest()


def encode_frame(kind, request_id, meta=b"{}", body=b"", sealer=None):
    """Return one frame as bytes (tagged when a ``sealer`` is given). ``meta`` is already-encoded JSON."""
    if len(meta) > MAX_META or len(body) > MAX_BODY:
        raise ProtocolError("frame too large: meta %d bytes, body %d bytes" % (len(meta), len(body)))
    header = HEADER.pack(MAGIC, PROTOCOL_VERSION, kind, request_id, len(meta), len(body))
    if sealer is None:
        return b"".join((header, meta, body))
    return b"".join((header, sealer.head(header), meta, body, sealer.tag((header, meta, body))))


class FrameDecoder(object):
    """Incremental decoder: feed it any slices of the stream, get whole frames back.

    ``feed`` returns a list of ``(kind, request_id, meta_bytes, body_bytes)``. A frame of another
    protocol version is skipped whole and reported by raising ``UnsupportedVersion`` (the stream
    stays usable); bad magic or an oversized frame raise ``ProtocolError`` (the stream is lost).

    Keyed (:meth:`authenticate`), every frame must carry its tag, or ``Tampered`` is raised. Not
    yet keyed, decoding stops after a KEY frame: the frames behind it are tagged, and are decoded
    by the next ``feed`` once the caller has keyed the decoder.
    """

    __slots__ = ("_buf", "_pending", "_sealer")

    def __init__(self):
        self._buf = bytearray()
        self._pending = None
        self._sealer = None

    def authenticate(self, key, person):
        self._sealer = FrameSealer(key, person)

    @property
    def keyed(self):
        return self._sealer is not None

    def feed(self, data):
        self._buf += data
        frames = []
        buf = self._buf
        pos = 0
        skipped = None
        sealer = self._sealer
        tag = TAG_SIZE if sealer is not None else 0
        while True:
            if len(buf) - pos < HEADER.size + tag:
                break
            magic, version, kind, rid, meta_len, body_len = HEADER.unpack_from(buf, pos)
            start = pos + HEADER.size
            head = bytes(buf[pos:start]) if sealer is not None else b""
            if sealer is not None and not hmac.compare_digest(sealer.head(head), bytes(buf[start : start + tag])):
                raise Tampered("frame %d of a keyed stream has a forged or cut header" % sealer._seq)
            if magic != MAGIC:
                raise ProtocolError("bad frame magic %r at offset %d" % (bytes(magic), pos))
            if meta_len > MAX_META or body_len > MAX_BODY:
                raise ProtocolError("frame too large: meta %d bytes, body %d bytes" % (meta_len, body_len))
            start += tag
            end = start + meta_len + body_len
            if len(buf) < end + tag:
                break
            meta, body = bytes(buf[start : start + meta_len]), bytes(buf[start + meta_len : end])
            if sealer is not None:
                expected = sealer.tag((head, meta, body))
                if not hmac.compare_digest(expected, bytes(buf[end : end + tag])):
                    why = "frame %d of a keyed stream (kind %d, request %d) fails its tag" % (sealer._seq - 1, kind, rid)
                    raise Tampered(why)
            pos = end + tag
            if version != PROTOCOL_VERSION:
                if skipped is None:
                    skipped = UnsupportedVersion(version, rid)
                continue
            frames.append((kind, rid, meta, body))
            if kind == K_KEY and sealer is None:
                break
        if pos:
            del buf[:pos]
        if skipped is not None:
            skipped.frames = frames
            raise skipped
        return frames

    @property
    def buffered(self):
        return len(self._buf)


# ----------------------------------------------------------------------------------------------
# The agent proper: everything below runs inside the sandbox only.


def _set_nonblocking(fd):
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)


def _dumps(obj):
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


class _Capture(object):
    """Keeps the first ``cap`` bytes of a stream and counts all of them."""

    __slots__ = ("cap", "data", "kept", "keep", "total")

    def __init__(self, cap, keep=True):
        self.cap = cap
        self.data = bytearray()
        self.kept = 0
        # Streamed output goes to the daemon as it comes: holding it here too would spend the
        # sandbox's own memory on up to ``cap`` bytes nobody reads.
        self.keep = keep
        self.total = 0

    def add(self, chunk):
        """Record ``chunk``; return the part of it that is within the cap."""
        self.total += len(chunk)
        room = self.cap - self.kept
        if room <= 0:
            return b""
        kept = chunk[:room]
        self.kept += len(kept)
        if self.keep:
            self.data += kept
        return kept

    @property
    def truncated(self):
        return self.total > self.kept


class _Command(object):
    """One EXEC request: a process of its own, or a command in a persistent shell."""

    def __init__(self, agent, rid, req, stdin):
        self.agent = agent
        self.rid = rid
        self.stream = bool(req.get("stream"))
        self.out = _Capture(int(req.get("stdout_cap", 1 << 20)), keep=not self.stream)
        self.err = _Capture(int(req.get("stderr_cap", 1 << 20)), keep=not self.stream)
        # The daemon's own bounded reads: a command past its stdout cap is of no more use.
        self.cap_kills = bool(req.get("cap_kills"))
        timeout = req.get("timeout")
        self.started = time.monotonic()
        self.deadline = self.started + float(timeout) if timeout else None
        self.timed_out = False
        self.cancelled = False
        self.done = False
        self.epoch = agent.epoch  # the daemon connection that asked; answers go to no other

    def on_output(self, which, chunk):
        capture = self.out if which == 1 else self.err
        kept = capture.add(chunk)
        if self.stream and kept and self.epoch == self.agent.epoch:
            self.agent.send(K_STDOUT if which == 1 else K_STDERR, self.rid, b"{}", kept)
        if self.cap_kills and which == 1 and capture.truncated:
            self.cap_kills = False
            self.kill()

    def kill(self):
        pass

    def finish(self, exit_code, sig, extra=None):
        if self.done:
            return
        self.done = True
        meta = {
            "exit_code": exit_code,
            "signal": sig,
            "timed_out": self.timed_out,
            "cancelled": self.cancelled,
            "duration": time.monotonic() - self.started,
            "stdout_total": self.out.total,
            "stderr_total": self.err.total,
            "stdout_truncated": self.out.truncated,
            "stderr_truncated": self.err.truncated,
            "stdout_len": 0 if self.stream else len(self.out.data),
        }
        if extra:
            meta.update(extra)
        self.agent.orphans.discard(self)
        if self.epoch != self.agent.epoch:
            return  # asked by a connection that is gone: nobody is left to answer
        body = b"" if self.stream else bytes(self.out.data) + bytes(self.err.data)
        self.agent.send(K_RESULT, self.rid, _dumps(meta), body)
        if self.agent.commands.get(self.rid) is self:
            del self.agent.commands[self.rid]


class _Spawned(object):
    """What the agent uses of a ``subprocess.Popen``: pid and the pipes as unbuffered files."""

    def __init__(self, pid, stdin, stdout, stderr):
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode = None


_DEVNULL = []
_ENVIRON = []
_HOME = []
# (uid, gid) of the episode's commands when they run as an unprivileged user (--user; recycling
# pools): the agent stays root and out of their reach, and files it writes are theirs.
_OWNER = []
# Writable places a reset wipes, besides the workdir; each must be a mount of its own to count.
WIPED = ("/tmp", "/dev/shm", "/dev/mqueue")
LEFTOVER_NAMES = 10  # command lines an end of leftovers names (it counts every one)
LEFTOVER_NAME_CHARS = 120
RESET_KILL_WINDOW = 5.0  # seconds a reset may spend ending processes before it gives up


# Root's supplementary groups, once the agent found that its spawner thread may take the episode's
# user's ids around a spawn (_Spawner.call as_user); empty otherwise.
_ROOT = []
_LIBC = []  # a _Libc, where ctypes, posix_spawn and the raw id syscalls are there
_SPAWNER = []  # the _Spawner thread, once started (it starts at the first command)
STUCK_SPAWN = 1.0  # seconds a spawn may wait for its child's exec before the agent looks at why
_KILLED_BEFORE_EXEC = set()  # pids the agent killed stopped before their exec, until their command says so


def _out_of_reach():
    """Make PID 1 undumpable: its /proc files (fd, mem, environ) and ptrace then need
    CAP_SYS_PTRACE, which no sandbox has. A root episode (a root pool's commands, a clean room's
    tests) could otherwise trace the agent and make it report anything, or, on the attach stream
    (gVisor), open /proc/1/fd/1 and write frames the daemon takes for the agent's answers.
    Commands become dumpable again at their exec. False where ctypes or prctl is missing."""
    if os.getpid() != 1:
        return False
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
        return prctl(4, 0, 0, 0, 0) == 0 and prctl(3, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0, PR_GET_DUMPABLE
    except Exception:  # ImportError, OSError, AttributeError: a libc without it
        return False


def _allow_user_ids():
    """Fill _ROOT where the spawner thread may hold the episode's user's real and effective ids
    for a moment: in PID 1 (whose signals from inside the sandbox need a handler to arrive at all),
    as root, with the raw id syscalls (they change one thread's ids), on a kernel whose
    fs.suid_dumpable (0 or 2) makes a process that changes its ids undumpable for good (its /proc
    files stay root's). Checked once, at start; the first round trip happens here, before any
    command of the user exists."""
    if os.getpid() != 1 or not _OWNER or not _libc():
        return
    try:
        with open("/proc/sys/fs/suid_dumpable", "rb") as f:
            if f.read().strip() not in (b"0", b"2"):
                return
        if os.getresuid() != (0, 0, 0) or os.getresgid() != (0, 0, 0):
            return
        _ROOT.append(os.getgroups())
        _spawner().call(lambda: None, True)
    except (OSError, AttributeError, RuntimeError):  # RuntimeError: no thread could start
        del _ROOT[:]


def _libc():
    """The _Libc, or None where it cannot load (no ctypes, another libc or machine)."""
    if not _LIBC:
        try:
            _LIBC.append(_Libc())
        except Exception:  # ImportError, OSError, AttributeError, KeyError: whatever is missing
            _LIBC.append(None)
    return _LIBC[0]


class _Libc(object):
    """posix_spawn(p) and the raw setgroups/setresgid/setresuid syscalls through ctypes.

    A ctypes call lets go of the GIL, where ``os.posix_spawn`` holds it until the child has exec'd
    (so no other thread of the agent could run meanwhile); the raw syscalls change the ids of the
    calling thread only, where glibc's (``os.setresuid``) change every thread's."""

    SYSCALLS = {"x86_64": (116, 119, 117), "aarch64": (159, 149, 147)}  # setgroups, setresgid, setresuid
    SETSIGDEF, SETSIGMASK, SETSID = 0x04, 0x08, 0x80  # glibc's and musl's POSIX_SPAWN_* flags

    def __init__(self):
        import ctypes

        self.ct = ctypes
        self.nr = self.SYSCALLS[os.uname().machine]
        self.c = ctypes.CDLL(None, use_errno=True)
        # Opaque glibc/musl structures, given room to spare: 336, 80 and 128 bytes on x86-64 glibc.
        self.attr = ctypes.create_string_buffer(1024)
        empty, default = ctypes.create_string_buffer(256), ctypes.create_string_buffer(256)
        for sigset in (empty, default):
            self._check(self.c.sigemptyset(sigset) and ctypes.get_errno())
        for sig in _SIGDEF:
            self._check(self.c.sigaddset(default, sig) and ctypes.get_errno())
        self._check(self.c.posix_spawnattr_init(self.attr))
        flags = ctypes.c_short(self.SETSID | self.SETSIGDEF | self.SETSIGMASK)
        self._check(self.c.posix_spawnattr_setflags(self.attr, flags))
        self._check(self.c.posix_spawnattr_setsigmask(self.attr, empty))  # not the spawner's (all blocked)
        self._check(self.c.posix_spawnattr_setsigdefault(self.attr, default))
        self.c.posix_spawnp  # noqa: B018 - AttributeError here where the libc has none

    @staticmethod
    def _check(err, what=None):
        if err:
            raise OSError(err, os.strerror(err), what)

    def ids(self, uid, gid, groups=()):
        """The calling thread's ids: real and effective uid and gid, the saved ones root's, groups."""
        ct = self.ct
        setgroups, setresgid, setresuid = self.nr
        array = (ct.c_uint * max(len(groups), 1))(*groups)
        calls = [
            (setgroups, ct.c_long(len(groups)), array),
            (setresgid, ct.c_long(gid), ct.c_long(gid), ct.c_long(0)),
            (setresuid, ct.c_long(uid), ct.c_long(uid), ct.c_long(0)),
        ]
        if uid == 0:
            calls.reverse()  # root's uid first: only root may set the rest
        for call in calls:
            if self.c.syscall(ct.c_long(call[0]), *call[1:]) != 0:
                self._check(ct.get_errno())

    def spawn(self, program, argv, env, dup2, search):
        """posix_spawn(p) in a session of its own, with signals default and unblocked: the pid."""
        ct = self.ct
        args = [os.fsencode(a) for a in argv]
        pairs = []
        for key, value in env.items():
            key, value = os.fsencode(key), os.fsencode(value)
            if not key or b"=" in key:
                raise ValueError("illegal environment variable name %r" % key)
            pairs.append(key + b"=" + value)
        path = os.fsencode(program)
        if any(b"\0" in a for a in args + pairs + [path]):
            raise ValueError("embedded null byte")
        actions = ct.create_string_buffer(1024)
        self._check(self.c.posix_spawn_file_actions_init(actions))
        try:
            for fd, target in dup2:
                self._check(self.c.posix_spawn_file_actions_adddup2(actions, fd, target))
            pid = ct.c_int()
            c_argv = (ct.c_char_p * (len(args) + 1))(*args)
            c_env = (ct.c_char_p * (len(pairs) + 1))(*pairs)
            call = self.c.posix_spawnp if search else self.c.posix_spawn
            self._check(call(ct.byref(pid), path, actions, self.attr, c_argv, c_env), program)
            return pid.value
        finally:
            self.c.posix_spawn_file_actions_destroy(actions)


def _spawner():
    if not _SPAWNER:
        if sys.version_info < (3, 12) and hasattr(subprocess, "_USE_VFORK"):
            # 3.11's Popen holds the GIL in a vfork (as root): the main thread could not watch it.
            subprocess._USE_VFORK = False
        _SPAWNER.append(_Spawner())
    return _SPAWNER[0]


class _Spawner(object):
    """The thread that starts the commands, so that the agent never waits inside a spawn itself.

    Between its start and its exec a command's process is already the episode's (the user's, or
    root in a pool whose episodes are root), so the episode's processes may stop it (`kill -STOP
    -1` in a loop), and whatever started it waits for that exec (a vfork; Popen's error pipe).
    The agent's main thread hands each spawn to this thread and waits for it at most STUCK_SPAWN
    at a time; past that it kills the spawn's child if it is stopped: the spawn returns, the
    command ends with SIGKILL, and the agent answers throughout.

    As the user (``call(fn, as_user=True)``, where _allow_user_ids allowed it) this thread takes
    the user's real and effective ids itself, with the raw syscalls: the main thread stays root.
    The saved ids stay root's: nothing of the user's may trace the agent, read its memory or open
    its /proc files (undumpable since _allow_user_ids), and the thread takes root back at once.
    For that moment the user's processes may signal the agent through this thread's id (a signal
    to a thread's id goes to the whole process): SIGTERM and SIGINT have no handler meanwhile
    (PID 1 drops a signal without one sent from inside its namespace; a `docker stop` then takes
    its grace period), every signal is blocked in this thread; and they may change this thread's
    scheduling (nice, policy, CPU set are a thread's own): a thread found changed retires, and the
    next spawn starts a new one, which inherits the main thread's untouched scheduling."""

    def __init__(self):
        self.go = threading.Lock()
        self.go.acquire()
        self.done = threading.Lock()
        self.done.acquire()
        self.job = self.result = None
        self.retired = False
        self.tid = None
        self.started = threading.Event()
        thread = threading.Thread(target=self._serve, name="spawner")
        thread.daemon = True
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            thread.start()  # with every signal blocked: the main thread takes them all
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self.started.wait()

    def call(self, fn, as_user=False):
        """fn() on this thread (as the episode's user: as_user); its result, or its exception."""
        self.job = (fn, as_user)
        since = _boot_ticks() - 1
        handlers = None
        if as_user:
            handlers = (signal.signal(signal.SIGTERM, signal.SIG_DFL), signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            self.go.release()
            while not self.done.acquire(True, STUCK_SPAWN):
                self._end_stopped(since)
        except BaseException:  # a signal handler's exception: this thread is left to its call
            self.retired = True
            del _SPAWNER[:]
            raise
        finally:
            if handlers:
                signal.signal(signal.SIGTERM, handlers[0])
                signal.signal(signal.SIGINT, handlers[1])
        result, self.result = self.result, None
        if self.retired:
            del _SPAWNER[:]
        if isinstance(result, BaseException):
            raise result
        return result

    def _end_stopped(self, since):
        """SIGKILL this thread's child of the current call if it is stopped (before its exec)."""
        try:
            with open("/proc/self/task/%d/children" % (self.tid or 0), "rb") as f:
                pids = f.read().split()
        except OSError:  # no children files in this kernel: every process, by its parent below
            pids = [name for name in os.listdir(b"/proc") if name.isdigit()]
        me = os.getpid()
        for pid in pids:
            try:
                with open(b"/proc/%s/stat" % pid, "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                # state, parent, start time (clock ticks since boot): a child of this call
                if fields[0] in (b"T", b"t") and int(fields[1]) == me and int(fields[19]) >= since:
                    os.kill(int(pid), signal.SIGKILL)
                    if len(_KILLED_BEFORE_EXEC) > 1000:  # never claimed (a shell's, a reset's): forget
                        _KILLED_BEFORE_EXEC.clear()
                    _KILLED_BEFORE_EXEC.add(int(pid))
            except (OSError, IndexError, ValueError):
                continue

    def _serve(self):
        self.tid = threading.get_native_id() if hasattr(threading, "get_native_id") else None
        try:
            scheduling = _scheduling()
        except OSError:
            scheduling = None
        self.started.set()
        while True:
            self.go.acquire()
            fn, as_user = self.job
            try:
                self.result = self._as_user(fn, scheduling) if as_user else fn()
            except BaseException as e:
                self.result = e
            self.done.release()
            if self.retired:
                return

    def _as_user(self, fn, scheduling):
        uid, gid = _OWNER[0]
        try:
            _LIBC[0].ids(uid, gid)  # inside: root's ids come back after a change that half failed too
            return fn()
        finally:
            try:
                _LIBC[0].ids(0, 0, _ROOT[0])
            except BaseException:
                os._exit(70)  # never go on as anyone but root
            try:
                changed = _scheduling() != scheduling
            except OSError:
                changed = True
            if changed:
                self.retired = True  # the episode changed it: the next spawn gets a new thread


def _scheduling():
    """The calling thread's nice value, policy and CPU set."""
    return (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), os.sched_getaffinity(0))


def _boot_ticks():
    """Now in /proc/PID/stat's start-time unit (clock ticks since boot); 0 where unknown."""
    try:
        return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))
    except (AttributeError, OSError, ValueError):
        return 0


def _demote():
    """In the child, before exec: the episode's user, no supplementary groups."""
    uid, gid = _OWNER[0]
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


_SIGDEF = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ", "SIGXFZ") if hasattr(signal, n))


def _spawn(argv, env, cwd, with_stdin, root=False):
    """Start a command in a session of its own with pipes for its output (and input).

    posix_spawn (glibc and musl spawn with a vfork-style clone) costs the agent about half of what
    ``subprocess.Popen`` does per command, and a third of Popen's fork where the command changes
    the user (docs/BENCHMARKS.md). Like Popen: signals the agent ignores (SIGPIPE) are default
    again in the child, no other descriptor leaks into it (Python opens every one close-on-exec),
    OSError when the program or ``cwd`` is missing. The spawn itself runs on the _Spawner thread,
    which the agent's main thread watches for a child stopped before its exec.
    """
    as_user = bool(_OWNER) and not root
    libc = _libc()
    # posix_spawn cannot change the user: the spawner thread takes the user's ids around it,
    # where it may; elsewhere the user's commands are forked and change the user in the child.
    if libc is None or (as_user and not _ROOT):
        return _spawner().call(lambda: _popen(argv, env, cwd, with_stdin, root))
    if not _DEVNULL:
        _DEVNULL.append(os.open(os.devnull, os.O_RDWR | getattr(os, "O_CLOEXEC", 0)))
    program = argv[0]
    search = "/" not in program
    which = search and env is not None and "PATH" in env  # posix_spawnp would search the agent's PATH
    search = search and not which
    fds = []
    try:
        out_r, out_w = os.pipe()
        fds += [out_r, out_w]
        err_r, err_w = os.pipe()
        fds += [err_r, err_w]
        in_r = in_w = None
        if with_stdin:
            in_r, in_w = os.pipe()
            fds += [in_r, in_w]
        dup2 = ((in_r if with_stdin else _DEVNULL[0], 0), (out_w, 1), (err_w, 2))
        if not _HOME:
            _HOME.append(os.getcwd())
        home = _HOME[0] if cwd and cwd != _HOME[0] else None  # usually the workdir: no chdir at all
        if home is not None:
            os.chdir(cwd)  # the child starts where the agent is; the main thread waits meanwhile
        try:
            if env is None:
                if not _ENVIRON:  # a plain dict: os.environ decodes every entry on each iteration
                    _ENVIRON.append(dict(os.environb))
                env = _ENVIRON[0]

            def start():
                # As the user: the child is the user's from its start and execs with these ids;
                # PATH is searched with them (os.access checks the real ids), from the command's folder.
                path = _which(program, env["PATH"]) if which else program
                return libc.spawn(path, argv, env, dup2, search)

            pid = _spawner().call(start, as_user)
        finally:
            if home is not None:
                os.chdir(home)
    except BaseException:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        raise
    os.close(out_w)
    os.close(err_w)
    fcntl.fcntl(out_r, fcntl.F_SETFL, os.O_NONBLOCK)  # one call: a new pipe's read end has no other flags
    fcntl.fcntl(err_r, fcntl.F_SETFL, os.O_NONBLOCK)
    stdin = None
    if with_stdin:
        os.close(in_r)
        stdin = os.fdopen(in_w, "wb", 0)
    return _Spawned(pid, stdin, os.fdopen(out_r, "rb", 0), os.fdopen(err_r, "rb", 0))


def _which(program, path):
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise OSError(errno.ENOENT, "No such file or directory", program)


def _popen(argv, env, cwd, with_stdin, root=False):
    demote = {}
    if _OWNER and not root:
        if sys.version_info >= (3, 9):
            # The user change in C, in the child: no Python runs there (a preexec_fn costs the
            # child the interpreter's after-fork work and its copy-on-write faults: a third of
            # a recycling pool's per-command CPU).
            uid, gid = _OWNER[0]
            demote = {"user": uid, "group": gid, "extra_groups": []}
        else:
            demote = {"preexec_fn": _demote}
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,
        close_fds=True,
        **demote,
    )


class _ProcessCommand(_Command):
    """A command run as its own process group: argv, or ``sh -c`` of a shell string."""

    def __init__(self, agent, rid, req, stdin):
        _Command.__init__(self, agent, rid, req, stdin)
        argv = req.get("argv")
        if not argv:
            argv = [agent.shell_path, "-c", req["shell"]]
        env = None
        if req.get("env"):
            env = dict(os.environ)
            env.update(req["env"])
        warm = req.get("warm")
        # A warm run (the clean room's pytest) forks from the sandbox's warm interpreter, where
        # there is one; otherwise the command runs as it would have anyway.
        self.proc = agent.warm_spawn(warm, env, req.get("cwd") or None, bool(stdin)) if warm and _OWNER else None
        if self.proc is None:
            # "root": the daemon's own command, as the agent's user even where the episode's
            # commands run as another (their processes can neither signal nor trace it).
            self.proc = _spawn(argv, env, req.get("cwd") or None, bool(stdin), bool(req.get("root")))
        self.pid = self.proc.pid
        if self.pid in _KILLED_BEFORE_EXEC:
            _KILLED_BEFORE_EXEC.discard(self.pid)
            self.on_output(2, b"rlsandbox: stopped before it could start (SIGSTOP from the sandbox's own processes): killed\n")
        self.exit_status = None
        self.exited_at = None
        self.open_pipes = 2
        # The room's last command (the clean room's tests): as it exits, every process it left
        # is ended, before anything reads what they could still change.
        self.end_leftovers = bool(req.get("end_leftovers"))
        self.extra = None
        spawned = isinstance(self.proc, _Spawned)  # its read ends are non-blocking already
        agent.watch(self.proc.stdout.fileno(), self, 1, nonblocking=spawned)
        agent.watch(self.proc.stderr.fileno(), self, 2, nonblocking=spawned)
        if stdin:
            agent.feed_stdin(self.proc.stdin, stdin)
        agent.by_pid[self.pid] = self

    def on_eof(self, which):
        self.open_pipes -= 1
        self.maybe_finish()

    def on_exit(self, status):
        self.exit_status = status
        self.proc.returncode = status  # keep subprocess from ever waiting on this pid again
        self.exited_at = time.monotonic()
        if self.end_leftovers:
            self.extra = self.agent.end_leftovers()
        self.maybe_finish()

    def kill(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def next_deadline(self):
        if self.exit_status is not None:
            return self.exited_at + DRAIN_GRACE
        return self.deadline

    def on_deadline(self, now):
        if self.exit_status is not None:
            self.maybe_finish(force=True)
        elif self.deadline is not None and now >= self.deadline:
            self.timed_out = True
            self.deadline = None
            self.kill()

    def cancel(self):
        self.cancelled = True
        self.kill()

    def maybe_finish(self, force=False):
        if self.done or self.exit_status is None or (self.open_pipes and not force):
            return
        if self.open_pipes:
            # The grace ran out with a pipe still open. Whatever is already in it still belongs
            # to this command (the loop may simply not have got to it yet); only a writer that
            # keeps it open (a background process) is cut off.
            for which, f in ((1, self.proc.stdout), (2, self.proc.stderr)):
                if f.fileno() not in self.agent.readers:
                    continue
                while True:
                    try:
                        data = os.read(f.fileno(), READ_CHUNK)
                    except (BlockingIOError, InterruptedError):
                        break
                    if not data:
                        break
                    self.on_output(which, data)
        for f in (self.proc.stdout, self.proc.stderr):
            self.agent.unwatch(f.fileno())
            f.close()
        if self.proc.stdin:
            self.agent.drop_stdin(self.proc.stdin)
        status = self.exit_status
        if os.WIFSIGNALED(status):
            self.finish(None, os.WTERMSIG(status), self.extra)
        else:
            self.finish(os.WEXITSTATUS(status), None, self.extra)


class _Shell(object):
    """A named, persistent bash whose cwd, variables and functions survive across commands."""

    def __init__(self, agent, name):
        self.agent = agent
        self.name = name
        self.queue = []
        self.current = None
        self.bufs = {1: bytearray(), 2: bytearray()}
        self.alive = True
        argv = [agent.bash_path, "--noprofile", "--norc"] if agent.bash_path else [agent.shell_path]
        self.proc = _spawn(argv, None, None, True)
        self.pid = self.proc.pid
        _set_nonblocking(self.proc.stdin.fileno())
        agent.watch(self.proc.stdout.fileno(), self, 1)
        agent.watch(self.proc.stderr.fileno(), self, 2)
        agent.by_pid[self.pid] = self

    def submit(self, cmd):
        self.queue.append(cmd)
        self.pump()

    def pump(self):
        if self.current is not None or not self.queue or not self.alive:
            return
        cmd = self.current = self.queue.pop(0)
        cmd.started = time.monotonic()
        if cmd.deadline is not None:
            cmd.deadline = cmd.started + cmd.timeout
        self.agent.write_to_shell(self, cmd.script())

    def on_output(self, which, chunk):
        buf = self.bufs[which]
        buf += chunk
        cmd = self.current
        if cmd is None:
            del buf[:]  # output of background jobs between commands
            return
        marker = cmd.marker
        idx = buf.find(marker)
        if idx < 0:
            keep = len(marker) - 1
            if len(buf) > keep:
                cut = len(buf) - keep
                cmd.on_output(which, bytes(buf[:cut]))
                del buf[:cut]
            return
        if which == 1:
            nl = buf.find(b"\n", idx + len(marker))
            if nl < 0:
                if idx:
                    cmd.on_output(which, bytes(buf[:idx]))
                    del buf[:idx]
                return
            cmd.exit_code = int(buf[idx + len(marker) : nl] or b"0")
            rest = nl + 1
        else:
            rest = idx + len(marker)
        if idx:
            cmd.on_output(which, bytes(buf[:idx]))
        del buf[:rest]
        cmd.seen[which] = True
        if cmd.seen[1] and cmd.seen[2]:
            self.complete(cmd.exit_code, None)

    def complete(self, exit_code, sig, extra=None):
        cmd = self.current
        self.current = None
        if cmd is not None:
            cmd.cleanup()
            cmd.finish(exit_code, sig, extra)
        self.pump()

    def on_eof(self, which):
        pass

    def on_exit(self, status):
        self.proc.returncode = status
        self.alive = False
        for f in (self.proc.stdout, self.proc.stderr):
            try:
                data = os.read(f.fileno(), READ_CHUNK)
                if data:
                    self.on_output(1 if f is self.proc.stdout else 2, data)
            except OSError:
                pass
            self.agent.unwatch(f.fileno())
            f.close()
        self.agent.drop_stdin(self.proc.stdin)
        if self.agent.shells.get(self.name) is self:
            del self.agent.shells[self.name]
        code, sig = (None, os.WTERMSIG(status)) if os.WIFSIGNALED(status) else (os.WEXITSTATUS(status), None)
        if self.current is not None:
            restarted = self.current.timed_out or self.current.cancelled
            self.complete(code if not restarted else None, sig if not restarted else signal.SIGKILL, {"shell_exited": True})
        for cmd in self.queue:
            cmd.finish(None, None, {"shell_exited": True, "error": "shell %r exited before this command ran" % self.name})
        self.queue = []

    def kill_children(self):
        """Kill everything in the shell's process group except the shell itself."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == self.pid:
                continue
            try:
                with open("/proc/%s/stat" % entry, "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if int(fields[2]) == self.pid:
                    os.kill(int(entry), signal.SIGKILL)
            except (OSError, IndexError, ValueError):
                pass

    def kill(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass


class _ShellCommand(_Command):
    def __init__(self, agent, rid, req, stdin):
        _Command.__init__(self, agent, rid, req, stdin)
        self.timeout = float(req["timeout"]) if req.get("timeout") else None
        token = os.urandom(8).hex()
        self.marker = ("\x1e__RLS_%s__" % token).encode()
        self.seen = {1: False, 2: False}
        self.exit_code = None
        self.kill_deadline = None
        self.files = []
        os.makedirs(SCRATCH, exist_ok=True)
        self.script_path = os.path.join(SCRATCH, "cmd-%s.sh" % token)
        with open(self.script_path, "wb") as f:
            f.write(req["shell"].encode("utf-8", "surrogateescape") + b"\n")
        self.files.append(self.script_path)
        self.stdin_path = "/dev/null"
        if stdin:
            self.stdin_path = os.path.join(SCRATCH, "stdin-%s" % token)
            with open(self.stdin_path, "wb") as f:
                f.write(stdin)
            self.files.append(self.stdin_path)
        self.prefix = ""
        for key, value in (req.get("env") or {}).items():
            self.prefix += "export %s=%s\n" % (key, _sh_quote(value))
        if req.get("cwd"):
            self.prefix += "cd -- %s && " % _sh_quote(req["cwd"])
        self.shell = None

    def script(self):
        m = _sh_quote(self.marker.decode())
        return (
            "%s{ . %s < %s ; } ; __rls_ec=$? ; printf '%%s%%d\\n' %s \"$__rls_ec\" ; printf '%%s' %s >&2\n"
            % (self.prefix, _sh_quote(self.script_path), _sh_quote(self.stdin_path), m, m)
        ).encode("utf-8", "surrogateescape")

    def cleanup(self):
        for path in self.files:
            try:
                os.unlink(path)
            except OSError:
                pass

    def next_deadline(self):
        if self.kill_deadline is not None:
            return self.kill_deadline
        if self.shell is not None and self.shell.current is self:
            return self.deadline
        return None

    def on_deadline(self, now):
        if self.kill_deadline is not None and now >= self.kill_deadline:
            self.shell.kill()  # the shell itself is stuck (a builtin loop): it has to go
            self.kill_deadline = None
        elif self.deadline is not None and now >= self.deadline:
            self.timed_out = True
            self.interrupt()

    def interrupt(self):
        self.deadline = None
        self.kill_deadline = time.monotonic() + SHELL_KILL_GRACE
        self.shell.kill_children()

    def cancel(self):
        self.cancelled = True
        if self.shell.current is self:
            self.interrupt()
        else:
            self.shell.queue.remove(self)
            self.cleanup()
            self.finish(None, None, {"error": "cancelled before it ran"})

    def finish(self, exit_code, sig, extra=None):
        self.kill_deadline = None
        _Command.finish(self, exit_code, sig, extra)


def _sh_quote(s):
    return "'" + s.replace("'", "'\"'\"'") + "'"


class Agent(object):
    """The agent's event loop.

    Transports: the container's stdin/stdout (``infd``/``outfd``); a unix socket the daemon
    listens on, in a host folder the sandbox sees read-only (``dial``: the agent connects, and
    connects again whenever the daemon goes away and comes back); or, for tests, a listening
    socket of its own (``listener``). With a socket the agent outlives the daemon: it keeps its
    commands running and waits for the next connection.
    """

    def __init__(self, infd=0, outfd=1, listener=None, dial=None):
        self.listener = listener
        self.dial_path = dial
        self.redial_at = 0.0
        self.redial_delay = DIAL_MIN
        self.conn = None
        self.epoch = 0  # bumped when a daemon connection goes away (socket mode)
        if listener is not None or dial is not None:
            infd = outfd = None
        self.infd = infd
        self.outfd = outfd
        self.sel = selectors.DefaultSelector()
        self.decoder = FrameDecoder()
        self.sealer = None  # a keyed stream's tagger of what the agent sends (K_KEY)
        self.first_frame = True  # ... which only the first frame of a stream may ask for
        self.exit_code = 0
        self.outbuf = bytearray()
        self.commands = {}
        self.orphans = set()  # commands of a daemon connection that is gone, being cancelled
        self.by_pid = {}
        self.readers = {}
        self.stdin_feeds = {}
        self.shells = {}
        self.spawn_backlog = []
        self.resets = 0
        self.warm = {}  # (python, module) -> _Warm: warm interpreters (recycling pools only)
        self.warm_wanted = set()  # (python, module) a run asked for: started at the next reset
        self.warm_failed = set()  # ... that could not start: never tried again
        self.running = True
        self.shell_path = "/bin/sh"
        self.bash_path = next((p for p in ("/bin/bash", "/usr/bin/bash") if os.path.exists(p)), None)
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w, infd, outfd):
            if fd is not None:
                _set_nonblocking(fd)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        if listener is not None:
            listener.setblocking(False)
            self.sel.register(listener, selectors.EVENT_READ, "accept")
        elif dial is None:
            self.sel.register(infd, selectors.EVENT_READ, "in")

    def _accept(self):
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self._attach(conn)

    def _dial(self):
        """Connect to the daemon's socket; on failure, try again a little later (up to DIAL_MAX)."""
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(self.dial_path)
        except OSError:  # no daemon listening yet (it restarts, or adopts others first)
            sock.close()
            self.redial_at = time.monotonic() + self.redial_delay
            self.redial_delay = min(self.redial_delay * 2, DIAL_MAX)
            return
        self.redial_delay = DIAL_MIN
        self._attach(sock)

    def _attach(self, conn):
        if self.conn is not None:  # one daemon at a time: the newest connection wins
            self._drop_connection()
        conn.setblocking(False)
        self.conn = conn
        self.infd = self.outfd = conn.fileno()
        self.decoder = FrameDecoder()
        self.sealer = None
        self.first_frame = True
        self.sel.register(conn, selectors.EVENT_READ, "conn")

    def _drop_connection(self):
        """Socket mode: the daemon went away (it may come back and re-adopt the sandbox).

        Its commands in flight are cancelled: nobody is left to read their results, and a daemon
        that reconnects numbers its requests from 1 again. Persistent shells, files and background
        processes the agent's commands started stay as they are.
        """
        self.sel.unregister(self.conn)
        self.conn.close()
        self.conn = None
        self.infd = self.outfd = None
        del self.outbuf[:]
        self.epoch += 1
        self.redial_at = time.monotonic() + DIAL_MIN
        orphans = list(self.commands.values())
        self.orphans.update(orphans)
        self.commands.clear()
        del self.spawn_backlog[:]
        for cmd in orphans:
            try:
                cmd.cancel()
            except (OSError, ValueError):
                pass

    def _hang_up(self):
        if self.conn is not None:
            self._drop_connection()
        else:  # stdio: nobody is left to answer to
            self.running = False

    # -- output ---------------------------------------------------------------------------------
    def send(self, kind, rid, meta=b"{}", body=b""):
        self.outbuf += encode_frame(kind, rid, meta, body, self.sealer)
        self._flush()

    def error(self, rid, code, message):
        self.send(K_ERROR, rid, _dumps({"code": code, "message": message}))

    def _flush(self):
        if self.outfd is None:
            del self.outbuf[:]
            return
        while self.outbuf:
            try:
                n = os.write(self.outfd, self.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                # The daemon went away mid-output (EPIPE, ECONNRESET): what it would have read is
                # dropped, never fatal. Socket mode waits for the next daemon; stdio ends.
                del self.outbuf[:]
                self._hang_up()
                return
            del self.outbuf[:n]
        self._update_out_interest()

    def _update_out_interest(self):
        want = bool(self.outbuf)
        if self.conn is not None:  # one fd both ways: change its interest, not its registration
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
            if self.sel.get_key(self.conn).events != events:
                self.sel.modify(self.conn, events, "conn")
            return
        key = self.sel.get_map().get(self.outfd)
        if want and key is None:
            self.sel.register(self.outfd, selectors.EVENT_WRITE, "out")
        elif not want and key is not None:
            self.sel.unregister(self.outfd)

    # -- child plumbing ---------------------------------------------------------------------------
    def watch(self, fd, owner, which, nonblocking=False):
        if not nonblocking:
            _set_nonblocking(fd)
        self.readers[fd] = (owner, which)
        self.sel.register(fd, selectors.EVENT_READ, "child")

    def unwatch(self, fd):
        if self.readers.pop(fd, None) is not None:
            self.sel.unregister(fd)

    def feed_stdin(self, pipe, data):
        fd = pipe.fileno()
        _set_nonblocking(fd)
        self.stdin_feeds[fd] = [pipe, memoryview(data)]
        self.sel.register(fd, selectors.EVENT_WRITE, "stdin")

    def write_to_shell(self, shell, data):
        fd = shell.proc.stdin.fileno()
        feed = self.stdin_feeds.get(fd)
        if feed is None:
            self.stdin_feeds[fd] = [shell.proc.stdin, memoryview(bytes(data)), "keep"]
            self.sel.register(fd, selectors.EVENT_WRITE, "stdin")
        else:
            feed[1] = memoryview(bytes(feed[1]) + data)

    def drop_stdin(self, pipe):
        if pipe is None:
            return
        fd = pipe.fileno() if not pipe.closed else None
        if fd is not None and self.stdin_feeds.pop(fd, None) is not None:
            self.sel.unregister(fd)
        try:
            pipe.close()
        except OSError:
            pass

    def _write_stdin(self, fd):
        feed = self.stdin_feeds[fd]
        pipe, view = feed[0], feed[1]
        try:
            n = os.write(fd, view[:READ_CHUNK])
            feed[1] = view = view[n:]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the reader went away: the rest of stdin is dropped
            view = b""
        if not len(view):
            del self.stdin_feeds[fd]
            self.sel.unregister(fd)
            if len(feed) < 3:
                pipe.close()

    def _reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            owner = self.by_pid.pop(pid, None)
            if owner is not None:
                owner.on_exit(status)
            # anything else was an orphan re-parented to us (we are PID 1): reaped, nothing to do

    # -- requests ---------------------------------------------------------------------------------
    def handle(self, kind, rid, meta, body):
        try:
            req = json.loads(meta.decode("utf-8")) if meta else {}
            if not isinstance(req, dict):
                raise ValueError("meta must be a JSON object")
        except ValueError as e:
            self.error(rid, "bad_request", "meta is not valid JSON: %s" % e)
            return
        try:
            if kind == K_PING:
                self.send(
                    K_RESULT,
                    rid,
                    _dumps(
                        {
                            "protocol": PROTOCOL_VERSION,
                            "agent_version": AGENT_VERSION,
                            "pid": os.getpid(),
                            "python": "%d.%d.%d" % sys.version_info[:3],
                            "bash": self.bash_path is not None,
                        }
                    ),
                )
            elif kind == K_EXEC:
                self._exec(rid, req, body)
            elif kind == K_CANCEL:
                target = int(req.get("target", -1))
                cmd = self.commands.get(target)
                if cmd is not None:
                    cmd.cancel()
                waiting = [b for b in self.spawn_backlog if b[0] == target]
                for entry in waiting:
                    self.spawn_backlog.remove(entry)
                    never = _Command(self, target, entry[1], b"")
                    never.cancelled = True
                    self.commands[target] = never
                    never.finish(None, None)
                self.send(K_RESULT, rid, _dumps({"found": cmd is not None or bool(waiting)}))
            elif kind == K_WRITE_FILES:
                self.send(K_RESULT, rid, _dumps(_write_files(req, body)))
            elif kind == K_READ_FILES:
                meta_out, data = _read_files(req)
                self.send(K_RESULT, rid, _dumps(meta_out), data)
            elif kind == K_LIST:
                self.send(K_RESULT, rid, _dumps(_list_dir(req)))
            elif kind == K_STAT:
                self.send(K_RESULT, rid, _dumps({"stats": [_stat(p) for p in req.get("paths", [])]}))
            elif kind == K_SHELL_CLOSE:
                shell = self.shells.pop(req.get("session", ""), None)
                if shell is not None:
                    shell.kill()
                self.send(K_RESULT, rid, _dumps({"found": shell is not None}))
            elif kind == K_RESET:
                self.send(K_RESULT, rid, _dumps(self._reset(req)))
            elif kind == K_SHUTDOWN:
                self.send(K_RESULT, rid, b"{}")
                self.running = False
            else:
                self.error(rid, "bad_request", "unknown request kind %d" % kind)
        except (KeyError, TypeError, ValueError) as e:
            self.error(rid, "bad_request", "%s: %s" % (type(e).__name__, e))
        except OSError as e:
            self.error(rid, "os_error", "%s: %s" % (e.strerror or type(e).__name__, e.filename or ""))
        except Exception as e:  # one request's failure is that request's answer, never the agent's end
            self.error(rid, "bad_request", "%s: %s" % (type(e).__name__, str(e)[:500]))

    def _exec(self, rid, req, stdin):
        if rid in self.commands:
            self.error(rid, "bad_request", "request id %d is already running" % rid)
            return
        name = req.get("session")
        if name:
            if not req.get("shell"):
                raise ValueError("a persistent shell session takes a shell string, not argv")
            shell = self.shells.get(name)
            if shell is None:
                shell = self.shells[name] = _Shell(self, name)
            cmd = _ShellCommand(self, rid, req, stdin)
            cmd.shell = shell
            self.commands[rid] = cmd
            shell.submit(cmd)
            return
        if not req.get("argv") and not req.get("shell"):
            raise ValueError("exec needs a non-empty argv or a shell string")
        try:
            cmd = _ProcessCommand(self, rid, req, stdin)
        except BlockingIOError:
            # EAGAIN from fork: the sandbox's pids limit is reached. Wait for processes to exit
            # instead of failing the command; it still fails at its own timeout.
            timeout = req.get("timeout")
            deadline = time.monotonic() + float(timeout) if timeout else None
            self.spawn_backlog.append((rid, req, stdin, deadline))
            return
        except OSError as e:
            # Like a shell: 127 when the program is missing, 126 when it cannot run.
            code = 127 if e.errno in (errno.ENOENT, errno.ENOTDIR) else 126
            if req.get("cwd") and not os.path.isdir(req["cwd"]):
                code = 126
            cmd = _Command(self, rid, req, stdin)
            cmd.on_output(2, ("rlsandbox: cannot run %r: %s\n" % (req.get("argv") or req.get("shell"), e.strerror)).encode())
            self.commands[rid] = cmd
            cmd.finish(code, None, {"spawn_error": e.strerror})
            return
        self.commands[rid] = cmd

    def _reset(self, req):
        """Make this sandbox as clean as a new one for the next episode, and prove it: every
        process but the agent ended, SysV IPC objects removed, the writable places emptied, the
        mount table as it was at start, no other place the episode's user could write. Returns
        {"ok": bool, "why": str, "checks": [...]}: anything unexpected is a failure (the daemon
        then destroys the sandbox). Only as PID 1 of a sandbox whose commands run as another
        user: anywhere else "every process" is not the episode's."""
        if os.getpid() != 1 or not _OWNER or not _BASELINE:
            raise ValueError("reset needs an agent that is PID 1 of its sandbox and runs commands as another user (--user)")
        checks = []
        for cmd in list(self.commands.values()):
            if isinstance(cmd, (_ProcessCommand, _ShellCommand)):
                cmd.cancelled = True
        for shell in list(self.shells.values()):
            shell.kill()
        self.shells.clear()
        self.spawn_backlog = []
        # 1. Every process but this one (SIGKILL cannot be caught; forks racing the first pass are
        #    caught by the next; zombies are reaped, since orphans come to PID 1).
        #    Warm interpreters are spared: root's, out of the episode's reach. Their pids cannot
        #    have been reused: a dead one stays a zombie until this agent reaps it, which forgets it.
        deadline = time.monotonic() + RESET_KILL_WINDOW
        while True:
            self._reap()
            spared = set(w.pid for w in self.warm.values() if w.alive)
            others = [p for p in _pids() if p != 1 and p not in spared]
            if not others:
                break
            if time.monotonic() > deadline:
                return {"ok": False, "why": "%d processes survived SIGKILL: %s" % (len(others), others[:10]), "checks": checks}
            if not spared:
                try:
                    os.kill(-1, signal.SIGKILL)  # from PID 1: every process of the namespace but itself
                except ProcessLookupError:
                    pass
            else:
                _kill_user()  # every process of the episode's user at once (forks cannot outrun it)
                for pid in others:  # then what is left (the daemon's own commands), one by one
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            time.sleep(0.001)
        checks.append("processes")
        # 2. SysV IPC objects outlive their processes.
        left = _remove_ipc()
        if left:
            return {"ok": False, "why": "SysV IPC objects remain: %s" % left, "checks": checks}
        checks.append("ipc")
        # 3. The writable places, emptied (never following a symlink out of them).
        mounts = _mounts()
        for place in (_BASELINE[1],) + WIPED:
            if place != _BASELINE[1] and place not in mounts:
                continue
            why = _empty(place)
            if why:
                return {"ok": False, "why": "cannot empty %s: %s" % (place, why), "checks": checks}
        uid, gid = _OWNER[0]
        os.chown(_BASELINE[1], uid, gid, follow_symlinks=False)
        # The workdir itself is the episode's user's: its mode and extended attributes (an ACL is
        # one) go back to what the sandbox started with, and are checked.
        why = _restore_folder(_BASELINE[1], _BASELINE[2])
        if why:
            return {"ok": False, "why": "the workdir %s" % why, "checks": checks}
        checks.append("wiped")
        # 4. Nothing else changed, nothing else is writable.
        if mounts.get("/", (True, ""))[0]:
            return {"ok": False, "why": "the root filesystem is writable: only a read-only root can be reset", "checks": checks}
        if _mountinfo() != _BASELINE[0]:
            return {"ok": False, "why": "the mount table changed", "checks": checks}
        why = _other_writable(mounts, (_BASELINE[1],) + WIPED, uid, gid)
        if why:
            return {"ok": False, "why": why, "checks": checks}
        checks.append("mounts")
        self.resets += 1
        # Nothing of any episode is left anywhere its user could write: the moment a warm
        # interpreter may start (it has imported everything before this answer goes out).
        for key in sorted(self.warm_wanted - set(self.warm) - self.warm_failed):
            try:
                _Warm(self, key[0], key[1]).wait_ready(WARM_START_TIMEOUT)
            except OSError:
                self.warm_failed.add(key)
        warm = sum(1 for w in self.warm.values() if w.alive and w.modules is not None)
        return {"ok": True, "why": "", "checks": checks, "resets": self.resets, "warm": warm}

    def end_leftovers(self):
        """End every process the room's last command left (a daemonized or double-forked writer
        the clean room's tests started): none may act after it. Called as that command exits,
        before its result is sent, so nothing the daemon reads next (reports, a reward file) can
        change any more. All of them are stopped at once (none can fork or write past that),
        named, then killed. Where commands run as the episode's user, only that user's processes:
        root's (the warm interpreters, the daemon's own commands) run on.

        Returns {"ended": count, "ended_names": [up to LEFTOVER_NAMES command lines]}, or
        {"ended": None} where this agent is not its sandbox's PID 1 ("every process" would not be
        the sandbox's)."""
        if os.getpid() != 1:
            return {"ended": None}
        user = _OWNER[0][0] if _OWNER else None

        def theirs():
            return [pid for pid in _pids() if pid != 1 and (user is None or _uid(pid) == user)]

        def signal_all(sig):
            try:
                if user is None:
                    os.kill(-1, sig)  # from PID 1: every process of the namespace but itself
                else:
                    _kill_user(sig)
                return
            except (OSError, RuntimeError):  # none left (ESRCH); no fork for the user's kill at the pids cap
                pass
            for pid in theirs():  # one by one, as root
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass

        signal_all(signal.SIGSTOP)
        others = theirs()
        names = [name for name in map(_cmdline, others) if name]  # a zombie's is empty: it had ended
        if others:
            signal_all(signal.SIGKILL)
        return {"ended": len(names), "ended_names": names[:LEFTOVER_NAMES]}

    def _retry_spawns(self):
        backlog, self.spawn_backlog = self.spawn_backlog, []
        now = time.monotonic()
        for i, (rid, req, stdin, deadline) in enumerate(backlog):
            if deadline is not None and now >= deadline:
                cmd = _Command(self, rid, req, stdin)
                cmd.timed_out = True
                cmd.on_output(2, b"rlsandbox: could not start the command: process limit reached\n")
                self.commands[rid] = cmd
                cmd.finish(None, None, {"spawn_error": "process limit reached"})
                continue
            self._exec(rid, req, stdin)
            if self.spawn_backlog and self.spawn_backlog[-1][0] == rid:
                self.spawn_backlog.extend(backlog[i + 1 :])
                return

    # -- main loop ----------------------------------------------------------------------------------
    def _on_term(self, *args):
        self.running = False

    def warm_spawn(self, warm, env, cwd, with_stdin):
        return _warm_spawn(self, warm, env, cwd, with_stdin)

    def _tracked(self):
        if self.orphans:
            return list(self.commands.values()) + list(self.orphans)
        return list(self.commands.values())

    def _next_timeout(self):
        deadlines = [d for d in (c.next_deadline() for c in self._tracked()) if d is not None]
        if self.dial_path is not None and self.conn is None:
            deadlines.append(self.redial_at)
        if self.spawn_backlog:
            deadlines.append(time.monotonic() + 0.05)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def run(self):
        while self.running:
            if self.dial_path is not None and self.conn is None and time.monotonic() >= self.redial_at:
                self._dial()
            for key, events in self.sel.select(self._next_timeout()):
                tag = key.data
                if tag == "in":
                    self._read_input()
                elif tag == "conn":
                    if events & selectors.EVENT_WRITE:
                        self._flush()
                    if events & selectors.EVENT_READ and self.conn is not None:
                        self._read_input()
                elif tag == "accept":
                    self._accept()
                elif tag == "child":
                    owner_which = self.readers.get(key.fd)
                    if owner_which is None:
                        continue
                    owner, which = owner_which
                    try:
                        data = os.read(key.fd, READ_CHUNK)
                    except (BlockingIOError, InterruptedError):
                        continue
                    if data:
                        owner.on_output(which, data)
                    else:
                        self.unwatch(key.fd)
                        owner.on_eof(which)
                elif tag == "out":
                    self._flush()
                elif tag == "stdin":
                    if key.fd in self.stdin_feeds:
                        self._write_stdin(key.fd)
                elif isinstance(tag, _Warm):  # a warm interpreter's socket: the object is the tag
                    tag.on_input()
                elif tag == "wake":
                    try:
                        os.read(self.wake_r, 4096)
                    except (BlockingIOError, InterruptedError):
                        pass
                    self._reap()
            if self.spawn_backlog:
                self._retry_spawns()
            now = time.monotonic()
            for cmd in self._tracked():
                d = cmd.next_deadline()
                if d is not None and now >= d:
                    cmd.on_deadline(now)
        self._shutdown()

    def _read_input(self):
        try:
            data = os.read(self.infd, READ_CHUNK * 4)
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionError:
            data = b""
        if not data:
            self._hang_up()
            return
        while True:
            try:
                frames = self.decoder.feed(data)
            except UnsupportedVersion as e:
                frames = e.frames
                self.error(e.request_id, "unsupported_version", str(e))
            except ProtocolError as e:
                self._broken(e)
                return
            data = b""
            for kind, rid, meta, body in frames:
                first, self.first_frame = self.first_frame, False
                if kind != K_KEY:
                    self.handle(kind, rid, meta, body)
                elif not self._take_key(first, rid, meta):
                    return
            if not frames or frames[-1][0] != K_KEY:
                return  # else the frames behind the key are tagged: decode them now

    def _take_key(self, first, rid, meta):
        """A keyed stream starts: from now on each frame, both ways, is tagged under ``key``."""
        try:
            key = bytes.fromhex(json.loads(meta.decode("utf-8"))["key"])
        except (ValueError, KeyError, TypeError):
            key = b""
        if not first or self.sealer is not None or not 16 <= len(key) <= 64:
            self._broken(ProtocolError("a stream key must come once, first, and be 16 to 64 bytes"))
            return False
        self.decoder.authenticate(key, TO_AGENT)
        self.sealer = FrameSealer(key, TO_DAEMON)
        self.send(K_RESULT, rid, b"{}")
        return True

    def _broken(self, e):
        """The stream cannot be read on. A keyed stream was tampered with from inside the sandbox:
        the agent says so (tagged: the daemon knows it is the agent's word) and, on its stdio,
        exits with EXIT_TAMPERED, which the container's exit status keeps."""
        if self.decoder.keyed:
            self.error(0, "tampered", "the agent's input stream was tampered with: %s" % e)
            if self.conn is None:
                self.exit_code = EXIT_TAMPERED
        else:
            self.error(0, "protocol_error", str(e))
        self._flush()
        self._hang_up()

    def _shutdown(self):
        for cmd in list(self.commands.values()):
            if isinstance(cmd, _ProcessCommand):
                cmd.kill()
        for w in list(self.warm.values()):
            w.close()
        for shell in list(self.shells.values()):
            shell.kill()
        deadline = time.monotonic() + 1.0
        if self.outfd is None:
            self._reap()
            return
        _set_blocking = fcntl.fcntl(self.outfd, fcntl.F_GETFL) & ~os.O_NONBLOCK
        fcntl.fcntl(self.outfd, fcntl.F_SETFL, _set_blocking)
        try:
            while self.outbuf and time.monotonic() < deadline:
                n = os.write(self.outfd, self.outbuf)
                del self.outbuf[:n]
        except OSError:
            pass
        self._reap()


# -- warm Python ----------------------------------------------------------------------------------
# The clean room's test runner spends most of its CPU importing itself: `import pytest` is ~170 ms of
# a ~240 ms run of a small task (docs/BENCHMARKS.md). In a recycling pool one sandbox serves grade
# after grade, so the agent keeps a warm interpreter there: a process of the image's python3,
# started by the agent, as root, which imports the runner from the read-only root only and then
# forks one child per run. The child becomes the episode's user and takes the run's pipes, working
# folder, environment and import path as `python3 -m MODULE ARGS` would have had them.
#
# What the warm interpreter may hold is what the image holds. It starts only at the end of a
# successful reset, when every place the episode's user can write has just been proven empty, and
# the agent waits until it has imported everything (so its start-up, `.pth` files and
# `sitecustomize` included, sees no file of any episode or task). It imports from read-only
# folders only (import hooks that `.pth` files installed are set aside; every module it loaded is
# checked), reads nothing after that but the agent's requests, over a socket pair only the agent
# has, and is out of the reach of the episode's user, whose processes can neither signal nor trace
# it. A reset spares it (every process of the episode's user ends at once, then every other one but
# it). The first warm-eligible run of a sandbox runs the usual way and asks for a warm interpreter
# at the next reset. A run whose import roots hold a module named like one the warm interpreter has
# loaded runs the usual way too: there the module the run would import is the workspace's.
WARM_MODULES = ("pytest",)
WARM_IDLE = 120.0  # seconds a warm interpreter with nothing to run waits before it exits (memory back)
WARM_FORK_TIMEOUT = 5.0  # seconds the agent waits for a warm interpreter to fork a run
WARM_START_TIMEOUT = 5.0  # seconds a reset waits for a warm interpreter's imports (within RESET_TIMEOUT)
WARM_MAX_REQUEST = 60000  # bytes: a larger run (a huge environment) runs the usual way
WARM_SAME_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")  # a run with other values runs the usual way


class _Warm(object):
    """A warm interpreter of one Python and module, as the agent sees it."""

    def __init__(self, agent, python, module):
        import socket

        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The interpreter settings of a grade's run (sys.flags match it), and no user site of its own.
        env = dict((k, v) for k, v in os.environ.items() if not k.startswith("PYTHON"))
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONUSERBASE="/nonexistent/.rlsandbox-warm")
        uid, gid = _OWNER[0]
        try:
            self.proc = subprocess.Popen(
                [python, os.path.abspath(__file__), "--warm", module, "%d:%d" % (uid, gid), str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env=env,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.agent = agent
        self.key = (python, module)
        self.sock = mine
        self.pid = self.proc.pid
        self.modules = None  # top-level names it has loaded, once it is ready
        self.alive = True
        self.seq = 0
        mine.setblocking(False)
        agent.by_pid[self.pid] = self
        agent.sel.register(mine, selectors.EVENT_READ, self)
        agent.warm[self.key] = self

    def wait_ready(self, timeout):
        """Block until it has imported everything (True), or end it (False; when it ended by
        itself, it never starts again in this sandbox: a slow start may be tried again)."""
        deadline = time.monotonic() + timeout
        ended = False
        try:
            while self.alive and self.modules is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.sock.settimeout(left)
                msg = self.sock.recv(1 << 20)
                if not msg:
                    ended = True
                    break
                self.on_message(msg)
        except (OSError, ValueError):
            pass
        if self.alive:
            self.sock.setblocking(False)
        if self.modules is None:
            self.close(failed=ended)
        return self.modules is not None

    def on_input(self):
        while self.alive:
            try:
                msg = self.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                msg = b""
            if not msg:
                self.close(failed=self.modules is None)
                return
            self.on_message(msg)

    def on_message(self, msg):
        try:
            m = json.loads(msg.decode("utf-8"))
        except ValueError:
            self.close()
            return
        if "ready" in m:
            self.modules = frozenset(m.get("modules") or ())
        elif "exit" in m:
            owner = self.agent.by_pid.pop(int(m["exit"]), None)
            if owner is not None:
                owner.on_exit(int(m["status"]))

    def spawn(self, msg, fds):
        """Fork the run ``msg`` asks for (encoded, with id ``self.seq``); its pid, or None (this warm
        interpreter is then closed)."""
        import array
        import socket

        try:
            self.sock.settimeout(WARM_FORK_TIMEOUT)
            self.sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            while True:
                reply = self.sock.recv(1 << 20)
                if not reply:
                    raise OSError("the warm interpreter is gone")
                m = json.loads(reply.decode("utf-8"))
                if m.get("id") == self.seq:
                    pid = m.get("pid")
                    if not isinstance(pid, int):
                        raise OSError("the warm interpreter could not fork")
                    return pid
                self.on_message(reply)
        except (OSError, ValueError):
            self.close()
            return None
        finally:
            if self.alive:
                self.sock.setblocking(False)

    def on_exit(self, status):
        self.proc.returncode = status  # keep subprocess from ever waiting on this pid again
        self.close(failed=self.modules is None)

    def close(self, failed=False):
        """Forget it and end it; its running children come to PID 1 (the agent), which reaps them.
        ``failed``: it could not start (never tried again in this sandbox)."""
        if not self.alive:
            return
        self.alive = False
        if failed:
            self.agent.warm_failed.add(self.key)
        self.agent.warm_wanted.discard(self.key)  # the next warm-eligible run asks again
        self.agent.warm.pop(self.key, None)
        try:
            self.agent.sel.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass


def _import_roots(cwd, env):
    roots = [cwd]
    for entry in (env.get("PYTHONPATH") or "").split(os.pathsep):
        if entry:
            roots.append(os.path.join(cwd, entry))
    return roots


def _shadows(roots, modules):
    """Whether a folder of ``roots`` holds a module named like one of ``modules``."""
    for root in roots:
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            if name.partition(".")[0] in modules:
                return True
    return False


def _warm_spawn(agent, warm, env, cwd, with_stdin):
    """A warm run as a _Spawned, or None when it should run the usual way (no warm interpreter
    ready yet, one is being started, or the run's import roots shadow what it has loaded)."""
    python, module, args = warm.get("python"), warm.get("module"), warm.get("args")
    if module not in WARM_MODULES or not isinstance(args, list) or os.getpid() != 1:
        return None
    env = dict(os.environ) if env is None else env
    cwd = cwd or os.getcwd()
    if any(env.get(k) != os.environ.get(k) for k in WARM_SAME_ENV):
        return None  # read as an interpreter starts: the warm one started with the agent's
    try:
        exe = python if "/" in python else _which(python, env.get("PATH", ""))
    except (OSError, TypeError):
        return None
    if not (_read_only(exe) and _read_only(os.path.realpath(exe))):
        return None  # an interpreter someone could have written: never run as root
    w = agent.warm.get((exe, module))
    if w is None:
        if (exe, module) not in agent.warm_failed:
            agent.warm_wanted.add((exe, module))  # started at the next reset
        return None
    if w.modules is None or _shadows(_import_roots(cwd, env), w.modules):
        return None
    w.seq += 1
    msg = _dumps({"id": w.seq, "args": [str(a) for a in args], "env": env, "cwd": cwd})
    if len(msg) > WARM_MAX_REQUEST:
        return None
    if not _DEVNULL:
        _DEVNULL.append(os.open(os.devnull, os.O_RDWR | getattr(os, "O_CLOEXEC", 0)))
    ours = []
    theirs = []
    try:
        if with_stdin:
            in_r, in_w = os.pipe()
            ours.append(in_w)
            theirs.append(in_r)
        else:
            theirs.append(_DEVNULL[0])
        out_r, out_w = os.pipe()
        ours.append(out_r)
        theirs.append(out_w)
        err_r, err_w = os.pipe()
        ours.append(err_r)
        theirs.append(err_w)
        pid = w.spawn(msg, theirs)
    finally:
        for fd in theirs:
            if fd != _DEVNULL[0]:
                os.close(fd)
    if pid is None:
        for fd in ours:
            os.close(fd)
        return None
    stdin = os.fdopen(ours[0], "wb", 0) if with_stdin else None
    out_r, err_r = ours[-2:]
    fcntl.fcntl(out_r, fcntl.F_SETFL, os.O_NONBLOCK)
    fcntl.fcntl(err_r, fcntl.F_SETFL, os.O_NONBLOCK)
    return _Spawned(pid, stdin, os.fdopen(out_r, "rb", 0), os.fdopen(err_r, "rb", 0))


def _read_only(path):
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _warm_inspect():
    """Fill inspect's cache of which module each loaded file is, once, for the runs to inherit.

    A failing test's report looks up the module of its frames (``inspect.getmodule``), whose first
    miss in a process reads the file of every loaded module: ~6 ms of each forked run's ~70 ms
    (measured in the python-task image). The cache maps files to module names, both from the
    read-only root loaded here; this interpreter's own entry (``__main__``, the agent) is left
    out: a run's ``__main__`` is another module.
    """
    import inspect

    try:
        inspect.getmodule(inspect.getmodule.__code__)  # a code object: a lookup by file, which fills the cache
        by_file = getattr(inspect, "modulesbyfile", {})
        for path in [f for f, name in by_file.items() if name == "__main__"]:
            del by_file[path]
        getattr(inspect, "_filesbymodname", {}).pop("__main__", None)
    except Exception:  # an inspect without these caches: the runs fill their own
        pass


def _warm_main(module, owner, fd):
    """The warm interpreter (``sandbox_agent.py --warm MODULE UID:GID FD``), started by the agent."""
    import array
    import gc
    import importlib.machinery
    import runpy  # noqa: F401 - what every run uses, loaded once
    import select
    import site
    import socket
    import types  # noqa: F401

    if module not in WARM_MODULES:
        return 2
    uid, _, gid = owner.partition(":")
    uid, gid = int(uid), int(gid)
    sock = socket.socket(fileno=fd)
    # Imports from the read-only root only: nothing the episode's user wrote can run here.
    base = sys.path[1:]  # [0]: the agent's folder
    sys.path[:] = [p for p in base if p and _read_only(p)]
    standard = (importlib.machinery.BuiltinImporter, importlib.machinery.FrozenImporter, importlib.machinery.PathFinder)
    hooks = list(sys.meta_path)
    sys.meta_path[:] = [f for f in hooks if f in standard]
    sys.path_importer_cache.clear()
    __import__(module)
    if module == "pytest":
        from _pytest.config import default_plugins  # what every run imports as it starts

        for name in default_plugins:
            try:
                __import__("_pytest." + name)
            except Exception:
                pass
        _warm_inspect()
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        prctl = None
    for name, mod in list(sys.modules.items()):
        where = getattr(mod, "__file__", None)
        if isinstance(where, str) and not _read_only(where):
            return 3  # loaded from a writable place: never warm
    sys.meta_path[:] = hooks
    sitedirs = set(site.getsitepackages()) if hasattr(site, "getsitepackages") else set()
    loaded = sorted(set(n.partition(".")[0] for n in sys.modules))
    wake_r, wake_w = os.pipe()
    _set_nonblocking(wake_r)
    _set_nonblocking(wake_w)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    for stream in (sys.stdout, sys.stderr):  # nothing written here may reach a run's output
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    # What the runs inherit, out of the cycle collector's sight: a run's full collection would
    # otherwise walk (and write the header of) every inherited object, copying the pages they are
    # on: measured, 4 runs at once cost 151 ms of CPU each without this, 109 ms with it.
    gc.collect()
    gc.freeze()
    sock.send(_dumps({"ready": True, "modules": loaded}))
    children = set()
    idle_since = time.monotonic()
    while True:
        timeout = None if children else max(0.0, idle_since + WARM_IDLE - time.monotonic())
        try:
            ready = select.select([sock, wake_r], [], [], timeout)[0]
        except InterruptedError:
            continue
        if not ready and not children:
            return 0
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except OSError:
                pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            except InterruptedError:
                continue
            if pid == 0:
                break
            children.discard(pid)
            sock.send(_dumps({"exit": pid, "status": status}))
            if not children:
                idle_since = time.monotonic()
        if sock not in ready:
            continue
        try:
            msg, ancillary, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(3 * 4))
        except InterruptedError:
            continue
        fds = []
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(data[: len(data) - len(data) % got.itemsize])
                fds.extend(got)
        if not msg:
            return 0
        req = json.loads(msg.decode("utf-8"))
        pid = None
        if len(fds) == 3:
            try:
                pid = os.fork()
            except OSError:
                pid = None
            if pid == 0:
                _warm_child(module, req, fds, base, sitedirs, uid, gid, prctl, sock)
                os._exit(0)  # not reached: the run ends in SystemExit
        for f in fds:
            os.close(f)
        if pid is not None:
            children.add(pid)
        sock.send(_dumps({"id": req.get("id"), "pid": pid}))


def _warm_child(module, req, fds, base, sitedirs, uid, gid, prctl, sock):
    """In the forked child: become the run `python3 -m MODULE ARGS` would have been, and run it."""
    import importlib
    import runpy
    import site
    import types

    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        sock.detach()
        for fd in [int(n) for n in os.listdir("/proc/self/fd")]:  # not closerange: up to 1M calls
            if fd > 2:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if prctl is not None:
            prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, as after an exec: /proc/self is the run's own
        env = req["env"]
        os.chdir(req["cwd"])
        cwd = os.getcwd()
        env["PWD"] = cwd  # as the shell the run would have started from sets it
        os.environ.clear()
        os.environ.update(env)
        # The path `python3 -m` makes: the working folder, PYTHONPATH, the standard library, the
        # user site (unless PYTHONNOUSERSITE), the site folders with their .pth files.
        path = [cwd] + [os.path.abspath(p) for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p]
        cut = next((i for i, p in enumerate(base) if p in sitedirs), len(base))
        sys.path[:] = path + base[:cut]
        site.ENABLE_USER_SITE = not env.get("PYTHONNOUSERSITE")
        if site.ENABLE_USER_SITE:
            site.USER_BASE = env.get("PYTHONUSERBASE") or os.path.join(os.path.expanduser("~"), ".local")
            get_path = getattr(site, "_get_path", None)
            version = "python%d.%d" % sys.version_info[:2]
            fallback = os.path.join(site.USER_BASE, "lib", version, "site-packages")
            site.USER_SITE = get_path(site.USER_BASE) if get_path else fallback
            if os.path.isdir(site.USER_SITE):
                site.addsitedir(site.USER_SITE)
        for p in base[cut:]:
            if p in sitedirs:
                site.addsitedir(p)
            elif p not in sys.path:
                sys.path.append(p)
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        sys.path_importer_cache.clear()
        importlib.invalidate_caches()
        sys.argv = [""] + [str(a) for a in req["args"]]
        sys.modules["__main__"] = types.ModuleType("__main__")
    except BaseException as e:
        try:
            os.write(2, ("rlsandbox: the warm %s could not start: %s\n" % (module, e)).encode())
        finally:
            os._exit(127)
    runpy._run_module_as_main(module)
    sys.exit(0)


# -- recycling --------------------------------------------------------------------------------------
_BASELINE = []  # [mountinfo at start, workdir]: what a reset compares against


def _pids():
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _uid(pid):
    """A process's real uid (its status file is readable even where the process is not dumpable);
    None for one gone."""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cmdline(pid):
    """A process's command line, shortened for a message; empty for a zombie or one gone."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read(LEFTOVER_NAME_CHARS + 1)
    except OSError:
        return ""
    # The episode chose it: no control character (a newline, a terminal escape) reaches a message.
    text = "".join(c if c.isprintable() else " " for c in raw.decode("utf-8", "replace")).strip()
    return text if len(text) <= LEFTOVER_NAME_CHARS else text[: LEFTOVER_NAME_CHARS - 3] + "..."


def _mountinfo():
    with open("/proc/self/mountinfo", "rb") as f:
        return f.read()


def _mounts():
    """{mount point: (read-write, fs type)} of this mount namespace."""
    out = {}
    for line in _mountinfo().decode("utf-8", "replace").splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 6:
            continue
        point = fields[4].replace("\\040", " ")
        options = fields[5].split(",")
        fstype = right.split()[0] if right else ""
        out[point] = ("rw" in options, fstype)
    return out


def _as_user(action):
    """Run ``action`` in a child that is the episode's user, and wait for it (on the spawner
    thread, which the main thread watches: the episode's processes may stop that child)."""
    _spawner().call(lambda: _fork_as_user(action))


def _fork_as_user(action):
    pid = os.fork()
    if pid == 0:
        try:
            _demote()
            action()
        finally:
            os._exit(0)
    while True:
        try:
            os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            break


def _kill_user(sig=signal.SIGKILL):
    """Send ``sig`` (SIGKILL) to every process of the episode's user in one call: kill(-1) as that
    user reaches exactly the processes it may signal, all at once (never PID 1: the agent itself,
    whose spawner thread takes the user's ids for it; otherwise a child of it that is the user sends it)."""

    def kill():
        try:
            os.kill(-1, sig)
        except ProcessLookupError:
            pass

    if not _ROOT:
        _as_user(kill)
        return

    _spawner().call(kill, True)


def _remove_ipc():
    """Remove every SysV shared memory segment, semaphore set and message queue; what is left.

    Removed by a child running as the episode's user: they are that user's, and root without
    CAP_SYS_ADMIN may not remove another user's objects. Most episodes leave none: no child then
    (every process of the user is gone before a reset gets here, so none can appear meanwhile)."""
    if not any(_ipc_ids(table) for table in ("shm", "sem", "msg")):
        return []

    def remove():
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        for table, ctl in (("shm", libc.shmctl), ("sem", libc.semctl), ("msg", libc.msgctl)):
            for ident in _ipc_ids(table):
                if table == "sem":
                    ctl(ident, 0, 0)  # semid, semnum, IPC_RMID
                else:
                    ctl(ident, 0, None)  # id, IPC_RMID, no buffer

    _as_user(remove)
    return ["%s %d" % (table, i) for table in ("shm", "sem", "msg") for i in _ipc_ids(table)]


def _ipc_ids(table):
    try:
        with open("/proc/sysvipc/" + table) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    return [int(line.split()[1]) for line in lines if len(line.split()) > 1]


def _empty(place):
    """Remove everything inside ``place`` (not the place itself); an error message, or ''."""
    import shutil

    try:
        names = os.listdir(place)
    except OSError as e:
        return e.strerror or str(e)
    for name in names:
        path = os.path.join(place, name)
        try:
            st = os.lstat(path)
            if stat_mod.S_ISDIR(st.st_mode):
                shutil.rmtree(path)  # fd-based on Linux: a symlink inside is removed, never followed
            else:
                os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            return "%s: %s" % (path, e.strerror or e)
    left = os.listdir(place)
    return "left: %s" % left[:5] if left else ""


def _folder_state(path):
    """A folder's mode bits and extended attributes (name -> value), as a reset restores them."""
    st = os.lstat(path)
    return stat_mod.S_IMODE(st.st_mode), _xattrs(path)


def _xattrs(path):
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}  # a filesystem without extended attributes
    found = {}
    for name in names:
        try:
            found[name] = os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            continue
    return found


def _restore_folder(path, state):
    """Put a folder's mode and extended attributes back to ``state``; what still differs, or ''."""
    mode, xattrs = state
    try:
        os.chmod(path, mode)  # the workdir is a mount point: the episode cannot put a symlink in its place
        for name, value in _xattrs(path).items():
            if xattrs.get(name) != value:
                if name in xattrs:
                    os.setxattr(path, name, xattrs[name], follow_symlinks=False)
                else:
                    os.removexattr(path, name, follow_symlinks=False)
    except OSError as e:
        return "cannot be restored: %s" % (e.strerror or e)
    if _folder_state(path) != state:
        return "differs from the sandbox's start after its restore"
    return ""


def _other_writable(mounts, wiped, uid, gid):
    """A read-write mount outside the wiped places that the episode's user could write, or ''.

    Docker's own read-write mounts (/etc/hosts, /etc/hostname, /etc/resolv.conf, /dev, ...) are
    root's and not writable by others: fine. Anything else (a VOLUME of the image, say) is not.
    """
    for point, (rw, fstype) in sorted(mounts.items()):
        if not rw or point in wiped or fstype in ("proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue"):
            continue
        try:
            st = os.lstat(point)
        except OSError:
            continue
        if stat_mod.S_ISCHR(st.st_mode):
            continue  # /dev/null bound over a masked path (/proc/keys, ...): nothing to keep there
        if st.st_uid == uid or st.st_mode & 0o002 or (st.st_gid == gid and st.st_mode & 0o020):
            return "%s is a read-write mount the episode's user can write (only the wiped places may be)" % point
    return ""


# -- files ------------------------------------------------------------------------------------------


def _write_files(req, body):
    results = []
    view = memoryview(body)
    offset = 0
    for spec in req["files"]:
        size = int(spec["size"])
        data = view[offset : offset + size]
        offset += size
        path = spec["path"]
        try:
            parent = os.path.dirname(path)
            if parent and spec.get("mkdir", True):
                _makedirs(parent)
            mode = int(spec.get("mode", 0o644))
            tmp = "%s.rls-tmp-%d" % (path, os.getpid())
            fd = _create_new(tmp, mode)
            if _OWNER:
                os.fchown(fd, _OWNER[0][0], _OWNER[0][1])
            try:
                while len(data):
                    n = os.write(fd, data)
                    data = data[n:]
            finally:
                os.close(fd)
            os.chmod(tmp, mode)
            os.rename(tmp, path)
            results.append({"path": path, "ok": True})
        except OSError as e:
            results.append({"path": path, "ok": False, "error": "%s" % (e.strerror or e)})
        except Exception as e:  # one bad path is that file's error, never the agent's end
            results.append({"path": path, "ok": False, "error": "%s: %s" % (type(e).__name__, e)})
    if offset != len(body):
        raise ValueError("file sizes add up to %d bytes but the body has %d" % (offset, len(body)))
    return {"files": results}


def _makedirs(path):
    """os.makedirs without recursion (a path thousands of folders deep is an error, not a crash)."""
    missing = []
    while path and path != "/" and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:
            if not os.path.isdir(folder):
                raise
            continue
        if _OWNER:
            os.chown(folder, _OWNER[0][0], _OWNER[0][1], follow_symlinks=False)


def _create_new(path, mode):
    """A new file at ``path``, never an existing one: whatever a command left there (a FIFO that
    would block the agent's open, a symlink) is removed first."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, mode)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, flags, mode)


def _read_regular(path, cap):
    """(data, size, truncated) of a regular file. Opened without blocking: a FIFO, device or
    socket would wedge the single-threaded agent, so anything but a regular file is refused."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or socket is not read)")
        parts = []
        got = 0
        while got <= cap:
            chunk = os.read(fd, min(cap + 1 - got, 1 << 20))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        data = b"".join(parts)
        return data[:cap], max(st.st_size, len(data)), len(data) > cap
    finally:
        os.close(fd)


def _read_files(req):
    cap = int(req.get("max_bytes", 1 << 20))
    out = []
    chunks = []
    for path in req["paths"]:
        try:
            data, size, truncated = _read_regular(path, cap)
            chunks.append(data)
            out.append({"path": path, "ok": True, "size": size, "length": len(data), "truncated": truncated})
        except OSError as e:
            out.append({"path": path, "ok": False, "error": e.strerror or str(e), "length": 0})
        except Exception as e:
            out.append({"path": path, "ok": False, "error": "%s: %s" % (type(e).__name__, e), "length": 0})
    return {"files": out}, b"".join(chunks)


def _stat(path):
    try:
        st = os.lstat(path)
    except OSError as e:
        return {"path": path, "exists": False, "error": e.strerror}
    if stat_mod.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat_mod.S_ISLNK(st.st_mode):
        kind = "symlink"
    elif stat_mod.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    return {
        "path": path,
        "exists": True,
        "type": kind,
        "size": st.st_size,
        "mode": stat_mod.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }


def _list_dir(req):
    root = req["path"]
    limit = int(req.get("max_entries", 10000))
    recursive = bool(req.get("recursive"))
    entries = []
    truncated = False
    stack = [root]
    while stack:
        top = stack.pop()
        names = sorted(os.listdir(top))
        for name in names:
            if len(entries) >= limit:
                truncated = True
                break
            full = os.path.join(top, name)
            info = _stat(full)
            info["name"] = os.path.relpath(full, root)
            entries.append(info)
            if recursive and info.get("type") == "dir":
                stack.append(full)
        if truncated:
            break
    return {"entries": entries, "truncated": truncated}


def listen_unix(path):
    """A listening unix socket at ``path`` (replacing a stale one), for the daemon only."""
    import socket

    try:
        os.unlink(path)
    except OSError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o077)
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    sock.listen(4)
    return sock


def main(argv=None):
    os.environ.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    argv = sys.argv[1:] if argv is None else argv
    listener = dial = None
    if argv[:1] == ["--warm"] and len(argv) == 4:
        return _warm_main(argv[1], argv[2], int(argv[3]))
    _out_of_reach()
    if argv[:1] == ["--user"] and len(argv) >= 2:
        uid, _, gid = argv[1].partition(":")
        _OWNER.append((int(uid), int(gid or uid)))
        argv = argv[2:]
        workdir = os.getcwd()
        os.chown(workdir, _OWNER[0][0], _OWNER[0][1], follow_symlinks=False)
        _BASELINE.extend([_mountinfo(), workdir, _folder_state(workdir)])
        _allow_user_ids()
    if argv[:1] == ["--socket"] and len(argv) == 2:
        listener = listen_unix(argv[1])
    elif argv[:1] == ["--connect"] and len(argv) == 2:
        dial = argv[1]
    elif argv:
        sys.stderr.write("usage: sandbox_agent.py [--user UID[:GID]] [--socket PATH | --connect PATH]\n")
        return 2
    agent = Agent(listener=listener, dial=dial)
    agent.run()
    return agent.exit_code


if __name__ == "__main__":
    sys.exit(main())
