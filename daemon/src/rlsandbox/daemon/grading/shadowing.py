"""What the agent may not put on the test command's import path or PATH: pure rules over snapshots.

Runners are resolved like any module: ``python3 -m pytest`` puts the working folder first on
``sys.path``, ``PYTHONPATH=src`` puts ``src`` there, and pytest inserts the first folder above
each test file that is not a package. A workspace file named like the runner, one of its
dependencies or a standard module, in any such folder, runs instead of the real one. So the
grader asks the clean room's interpreter which top-level names it resolves outside the workspace
(``PROBE``, run before any agent file is there), and the plan discards every new or changed file
that would shadow one of them from a folder that can be an import root:

- the workspace itself and every folder of it that is not a package (no ``__init__.py``);
- every folder the test command or the task's environment names in ``PYTHONPATH`` or ``cd``.

Names the base workspace already provides at that root are the project's own, and stay allowed.
Files in a workspace folder that the test command's ``PATH`` names are discarded too (a ``go``,
``node`` or ``pytest`` wrapper).

A Python environment inside the workspace (a virtualenv's ``pyvenv.cfg``, a conda ``conda-meta``,
a folder packages were installed into (``*.dist-info``), the interpreter's own prefix) holds the
runner and its dependencies, not the project: the probe names each one, and the grader treats it
as the task's ``workspace.exclude`` does (never read from the agent, the clean room keeps its
own), whether the task lists it or not.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rlsandbox.daemon.grading.task import check_relative

# Run by the clean room's interpreter with cwd=/ and the task's environment, with the workspace and
# its excluded paths (a virtualenv inside it: what resolves there is the image's, not the
# project's) as arguments; prints one JSON line.
PROBE = r"""
import collections, glob, json, os, pkgutil, sys
ws = os.path.realpath(sys.argv[1])
image = [os.path.realpath(p) for p in sys.argv[2:]]  # the workspace's excluded paths: the image's own
# Python environments inside the workspace, found before any agent file is there: the image's too.
envs = set()
if sys.prefix and os.path.realpath(sys.prefix).startswith(ws + "/"):
    envs.add(os.path.relpath(os.path.realpath(sys.prefix), ws))
# Breadth first: a large repository spends the budget on its deep folders last.
todo, seen = collections.deque([(ws, 0)]), 0
while todo and seen < 20000:
    folder, depth = todo.popleft()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        continue
    seen += len(entries)
    names = {e.name for e in entries}
    # A virtualenv, a conda env, or a folder packages were installed into (pip install --target,
    # __pypackages__): *.dist-info is what an install writes, never a project's source tree.
    installed = any(n.lower().endswith(".dist-info") for n in names)  # as importlib.metadata finds them
    if folder != ws and ("pyvenv.cfg" in names or "conda-meta" in names or installed):
        envs.add(os.path.relpath(folder, ws))
        continue
    if depth < 4:
        skip = (".git", "node_modules")
        todo.extend((e.path, depth + 1) for e in entries if e.name not in skip and e.is_dir(follow_symlinks=False))
envs = sorted(e for e in envs if e != "." and not e.startswith(".."))
image += [os.path.join(ws, e) for e in envs]
names = set(sys.builtin_module_names) | set(getattr(sys, "stdlib_module_names", ()))
for entry in sys.path:
    if not entry or not os.path.isabs(entry):
        continue
    real = os.path.realpath(entry)
    inside = lambda root: real == root or real.startswith(root + "/")
    if inside(ws) and not any(inside(p) for p in image):
        continue
    try:
        names.update(m.name for m in pkgutil.iter_modules([entry]))
    except Exception:
        pass
# Every top-level name this interpreter tries to import as it starts, with this environment
# (site's .pth files, a sitecustomize's own imports such as Debian's apport_python_hook, found or
# not): a module of that name on an import root would run before the runner and its guard.
try:
    import subprocess
    started = subprocess.run(
        [sys.executable, "-vv", "-c", "import sys; print(chr(0).join(sys.path))"],
        capture_output=True, timeout=30, env=os.environ, cwd="/",
    )
    roots = {os.path.realpath(p) for p in started.stdout.decode("utf-8", "surrogateescape").strip().split(chr(0)) if p}
    for line in started.stderr.decode("utf-8", "surrogateescape").splitlines():
        if line.startswith("# trying "):
            tried = line[len("# trying "):]
            if os.path.realpath(os.path.dirname(tried)) in roots:
                names.add(os.path.basename(tried).split(".", 1)[0])
except Exception:
    pass
# What those environments hold is the image's too, on this interpreter's path or not (a command
# may put one there itself: PYTHONPATH=.deps).
for env in envs:
    root = os.path.join(ws, env)
    for site_dir in [root, *glob.glob(os.path.join(root, "lib", "python*", "site-packages"))]:
        try:
            names.update(m.name for m in pkgutil.iter_modules([site_dir]))
        except Exception:
            pass
pytest_dir = ""
try:
    import _pytest
    pytest_dir = os.path.dirname(os.path.dirname(os.path.realpath(_pytest.__file__)))
except Exception:
    pass
user_site = ""
site_dir = ""  # the first folder whose .pth files this interpreter reads as it starts
try:
    import site
    user_site = os.path.relpath(site.getusersitepackages(), site.getuserbase())
    dirs = ([site.getusersitepackages()] if site.ENABLE_USER_SITE else []) + site.getsitepackages()
    site_dir = next((d for d in dirs if d in sys.path or not os.path.exists(d)), "")
except Exception:
    pass
# The PATH the test command starts with (the image's own, or the task's): a workspace folder on it
# holds programs the command may run.
path = os.environ.get("PATH", "")
facts = {"pytest_dir": pytest_dir, "user_site": user_site, "site_dir": site_dir, "path": path, "envs": envs}
print(json.dumps({"names": sorted(names), **facts}))
"""

_IMPORT_SUFFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\.py|\.pyc|\.pyw|\.so|\.pyd|\.[A-Za-z0-9_-]+\.so|\.abi3\.so)$")
_INTERPRETER = re.compile(r"^python[0-9.]*$")
_ASSIGN = re.compile(r"(?:^|[\s;&|(])(PYTHONPATH|PATH)=(\"[^\"]*\"|'[^']*'|[^\s;&|)]*)")
_CD = re.compile(r"(?:^|[\s;&|(])cd\s+(\"[^\"]*\"|'[^']*'|[^\s;&|)]+)")


@dataclass(frozen=True, slots=True)
class ImportFacts:
    """What the clean room's interpreter resolves without the workspace."""

    reserved: frozenset[str]
    pytest_dir: str = ""
    user_site: str = ""  # the user site-packages relative to PYTHONUSERBASE ("lib/python3.11/site-packages")
    site_dir: str = ""  # the first folder whose .pth files the interpreter runs as it starts
    path: str = ""  # the PATH the test command starts with (the image's, or the task's env)
    envs: tuple[str, ...] = ()  # workspace-relative Python environments: the image's, never the agent's

    @classmethod
    def parse(cls, stdout: bytes) -> ImportFacts:
        doc = json.loads(stdout.decode("utf-8").strip().splitlines()[-1])
        names = frozenset(str(n) for n in doc["names"])
        pytest_dir, user_site, site_dir, path = (str(doc.get(k) or "") for k in ("pytest_dir", "user_site", "site_dir", "path"))
        envs = tuple(check_relative(str(e)) for e in doc.get("envs") or ())
        return cls(names, pytest_dir, user_site, site_dir, path, envs)

    def merged(self, other: ImportFacts) -> ImportFacts:
        """The facts of two interpreters the command names: every reserved name, the first paths."""
        return ImportFacts(
            self.reserved | other.reserved,
            self.pytest_dir or other.pytest_dir,
            self.user_site or other.user_site,
            self.site_dir or other.site_dir,
            self.path or other.path,
            tuple(sorted({*self.envs, *other.envs})),
        )

    def excluded(self, task_exclude: Iterable[str]) -> list[str]:
        """The task's excluded paths and the environments found inside the workspace."""
        return list(dict.fromkeys([*task_exclude, *self.envs]))


def interpreters(test_command: str, workspace: str) -> list[str]:
    """The Python interpreters the test command names (python3 by default). One named by a path
    relative to the workspace (``.venv/bin/python``) is the image's as the probe runs it: no agent
    file is in the room yet."""
    try:
        words = shlex.split(test_command)
    except ValueError:
        words = test_command.split()
    found = [
        w if w.startswith("/") or "/" not in w else posixpath.normpath(posixpath.join(workspace, w))
        for w in words
        if _INTERPRETER.match(posixpath.basename(w)) and not w.startswith(("$", "~"))
    ]
    return list(dict.fromkeys(found or ["python3"]))


_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "source", "."})
_SCRIPT_RUNNERS = re.compile(r"^(python[0-9.]*|node|nodejs|ruby|perl|php)$")
# Scripts of an interpreter that are the runner, not the code under test (``python3 solution.py``
# may be the task's solution: it stays the agent's).
_RUNNER_SCRIPT = re.compile(r"(^|/)(setup|manage|noxfile|[^/]*tests?[^/]*)\.(py|js|mjs|cjs|rb|pl|php)$")
# What a runner program reads from the folder it starts in, and runs.
_RUNNER_FILES = {
    "make": ("GNUmakefile", "makefile", "Makefile"),
    "gmake": ("GNUmakefile", "makefile", "Makefile"),
    "nox": ("noxfile.py",),
    "invoke": ("tasks.py", "invoke.yaml"),
    "inv": ("tasks.py", "invoke.yaml"),
    "just": ("justfile", "Justfile", ".justfile"),
    "rake": ("Rakefile", "rakefile"),
    "cargo": ("Cargo.toml", "build.rs"),
    "mvn": ("pom.xml",),
    "gradle": ("build.gradle", "build.gradle.kts", "settings.gradle", "settings.gradle.kts"),
    "jest": ("jest.config.js", "jest.config.cjs", "jest.config.mjs", "jest.config.ts", "jest.config.json"),
    "vitest": ("vitest.config.js", "vitest.config.mjs", "vitest.config.ts", "vite.config.js", "vite.config.ts"),
    "mocha": (".mocharc.js", ".mocharc.cjs", ".mocharc.json", ".mocharc.yml", ".mocharc.yaml"),
}
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "|&", ";;"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def command_files(test_command: str, workspace: str, depth: int = 0, cwd: str = "") -> set[str]:
    """Workspace files (relative) the test command runs as its program or reads as its runner's
    script: a program named by a path (``./run_tests.sh``, ``.venv/bin/python``), a shell's
    script (``bash ci/test.sh``, ``sh -c '...'`` read in turn), an interpreter's script that is a
    runner (``python setup.py test``, ``node run-tests.js``), what a runner program reads from
    where it starts (make's makefiles, nox's noxfile, jest's config: ``_RUNNER_FILES``). Each with its
    folders on the way (a ``.venv`` symlink in place of the folder). They decide what the test run
    reports, so they are the task's: an agent's change to one is discarded (``plan_room``)."""
    lexer = shlex.shlex(test_command, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return set()
    commands: list[list[str]] = [[]]
    for token in tokens:
        if token in _SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    found: set[str] = set()

    def resolve(word: str) -> str | None:
        return _relative(word if word.startswith("/") else posixpath.join(cwd, word), workspace)

    def add(word: str) -> None:
        rel = resolve(word)
        if rel:
            parts = rel.split("/")
            found.update("/".join(parts[: i + 1]) for i in range(len(parts)))

    for words in commands:
        while words and _ASSIGNMENT.match(words[0]):
            words = words[1:]
        while words and words[0] in ("exec", "command", "env", "time", "nice", "timeout", "xvfb-run"):
            words = words[1:]
            while words and (words[0].startswith("-") or _ASSIGNMENT.match(words[0]) or words[0][:1].isdigit()):
                words = words[1:]
        if not words:
            continue
        program, args = words[0], words[1:]
        name = posixpath.basename(program)
        if program == "cd":
            target = next((a for a in args if not a.startswith("-")), "")
            cwd = (resolve(target) if target else None) or ""
            continue
        if "/" in program:
            add(program)
        operands = [a for a in args if not a.startswith("-")]
        if name in _SHELLS:
            if "-c" in args and depth < 3:
                script = args[args.index("-c") + 1] if args.index("-c") + 1 < len(args) else ""
                found |= command_files(script, workspace, depth + 1, cwd)
            elif operands:
                add(operands[0])
        elif _SCRIPT_RUNNERS.match(name) and operands and "-m" not in args[: args.index(operands[0])]:
            if "-c" not in args[: args.index(operands[0])] and _RUNNER_SCRIPT.search(operands[0]):
                add(operands[0])
        elif name in ("make", "gmake"):
            for i, a in enumerate(args):
                if a in ("-f", "--file", "--makefile") and i + 1 < len(args):
                    add(args[i + 1])
                elif a.startswith(("--file=", "--makefile=")):
                    add(a.split("=", 1)[1])
        runner = name if name in _RUNNER_FILES else next((a for a in operands[:1] if a in _RUNNER_FILES), "")
        # make -C DIR, cargo --manifest-path...: the folder it starts in, where it says so.
        start = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-C", "--directory")), "")
        for config in _RUNNER_FILES.get(runner, ()):
            add(posixpath.join(start, config) if start else config)
    return found


def _relative(entry: str, workspace: str) -> str | None:
    entry = entry.strip().strip("\"'")
    for cwd in ("$PWD", "${PWD}", "$(pwd)", "`pwd`"):
        if entry.startswith(cwd):
            entry = "." + entry[len(cwd) :]
    if not entry or entry.startswith(("$", "~")):
        return None
    if entry.startswith("/"):
        norm = posixpath.normpath(entry)
        if norm == workspace:
            return ""
        return norm[len(workspace) + 1 :] if norm.startswith(workspace + "/") else None
    norm = posixpath.normpath(entry)
    return None if norm.startswith("..") else ("" if norm == "." else norm)


def command_paths(test_command: str, env: Mapping[str, str], workspace: str) -> tuple[set[str], set[str]]:
    """Workspace folders (relative) the test command puts on the import path and on PATH."""
    imports: set[str] = set()
    execs: set[str] = set()
    assignments = [(k, v) for k, v in env.items() if k in ("PYTHONPATH", "PATH")]
    assignments += [(m.group(1), m.group(2)) for m in _ASSIGN.finditer(test_command)]
    for name, value in assignments:
        for entry in value.strip("\"'").split(":"):
            rel = _relative(entry, workspace)
            if rel is not None:
                (imports if name == "PYTHONPATH" else execs).add(rel)
    for m in _CD.finditer(test_command):
        rel = _relative(m.group(1), workspace)
        if rel is not None:
            imports.add(rel)
    return imports, execs


@dataclass(frozen=True, slots=True)
class Shadowing:
    """The shadowing rules of one grading: pass to ``workspace.plan``."""

    reserved: frozenset[str]
    import_dirs: frozenset[str] = frozenset()  # named by the command or env, beyond the implicit ones
    exec_dirs: frozenset[str] = frozenset()

    def why(self, path: str, kind: str, agent: Mapping[str, object], base: Mapping[str, object]) -> str | None:
        """Why the agent's new or changed ``path`` (a "file", "dir" or "symlink") may not reach the
        clean room, or None. A symlink is judged by its name alone: it may point at a package."""
        is_dir = kind == "dir"
        parent = posixpath.dirname(path)
        if not is_dir and parent in self.exec_dirs:
            return f"on the test command's PATH ({parent or 'workspace root'})"
        if not self.reserved:
            return None
        parts = path.split("/")
        for depth in range(len(parts)):
            root = "/".join(parts[:depth])
            if not self._is_root(root, agent):
                continue
            first = parts[depth]
            if depth == len(parts) - 1:
                if is_dir:
                    continue
                m = _IMPORT_SUFFIX.match(first)
                if m:
                    name = m.group(1)
                elif kind == "symlink":
                    name = first
                else:
                    continue
            else:
                name = first
                pkg = posixpath.join(root, first, "__init__.py")
                if pkg not in agent:
                    continue  # a namespace folder shadows no regular module
            if name in self.reserved and not _provides(base, root, name):
                where = root or "the workspace root"
                return (
                    f"shadows the module {name!r} of the runner, its dependencies or the standard library (import root {where})"
                )
        return None

    def _is_root(self, folder: str, agent: Mapping[str, object]) -> bool:
        return folder == "" or folder in self.import_dirs or posixpath.join(folder, "__init__.py") not in agent


def _provides(base: Mapping[str, object], root: str, name: str) -> bool:
    prefix = posixpath.join(root, name) if root else name
    if prefix in base:
        return True
    return any(
        p.startswith(prefix + "/")
        or (p.startswith(prefix + ".") and "/" not in p[len(prefix) :] and bool(_IMPORT_SUFFIX.match(posixpath.basename(p))))
        for p in base
        if p.startswith(prefix)
    )
