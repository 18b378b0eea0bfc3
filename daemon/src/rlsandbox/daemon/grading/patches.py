"""Unified diffs applied by the grader's own code: no git, make or shell reads the agent's tree.

``apply_patch`` takes the current content of the files a patch touches and returns their new
content (``None``: deleted). It understands what SWE-bench-style test patches use: git headers
(``diff --git``, new/deleted file modes, renames), ``---``/``+++`` lines, hunks whose context
moved by some lines (like ``git apply``, no fuzz), and "\\ No newline at end of file". Binary
patches are refused. Pure functions, no I/O.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """The patch cannot be applied to these files (the message names the file and the hunk)."""


@dataclass(slots=True)
class FilePatch:
    old_path: str | None  # None: the patch creates the file
    new_path: str | None  # None: the patch deletes the file
    mode: int | None = None
    hunks: list[tuple[int, list[bytes], list[bytes], bool, bool]] = field(default_factory=list)
    # (old start, old lines, new lines, old ends without newline, new ends without newline)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def _strip(name: bytes) -> str | None:
    text = name.split(b"\t")[0].decode("utf-8", "surrogateescape").strip()
    if text.startswith('"') and text.endswith('"'):
        # git quotes unusual names C-style, non-ASCII bytes as octal escapes.
        text = codecs.escape_decode(text[1:-1].encode("utf-8", "surrogateescape"))[0].decode("utf-8", "surrogateescape")
    if text == "/dev/null":
        return None
    return text[2:] if text[:2] in ("a/", "b/") else text


def parse_patch(patch: bytes) -> list[FilePatch]:
    """The files of a unified diff. Raises PatchError for what it cannot read."""
    lines = patch.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    files: list[FilePatch] = []
    cur: FilePatch | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(b"diff --git "):
            m = re.match(rb"^diff --git (\S+) (\S+)$", line)
            cur = FilePatch(_strip(m.group(1)) if m else None, _strip(m.group(2)) if m else None)
            files.append(cur)
        elif line.startswith((b"GIT binary patch", b"Binary files ")):
            raise PatchError(f"binary patch of {cur.path if cur else '?'}: not supported")
        elif cur is not None and line.startswith((b"new file mode ", b"new mode ")):
            cur.mode = int(line.split()[-1], 8) & 0o777
            if line.startswith(b"new file mode "):
                cur.old_path = None
        elif cur is not None and line.startswith(b"deleted file mode "):
            cur.new_path = None
        elif cur is not None and line.startswith(b"rename from "):
            cur.old_path = line[len(b"rename from ") :].decode("utf-8", "surrogateescape")
        elif cur is not None and line.startswith(b"rename to "):
            cur.new_path = line[len(b"rename to ") :].decode("utf-8", "surrogateescape")
        elif line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            old, new = _strip(line[4:]), _strip(lines[i + 1][4:])
            if cur is None or cur.hunks or (cur.old_path != old and cur.new_path != new and cur.path not in (old, new)):
                cur = FilePatch(old, new)
                files.append(cur)
            else:
                cur.old_path, cur.new_path = old, new
            i += 1
        elif line.startswith(b"@@"):
            if cur is None:
                raise PatchError(f"hunk at line {i + 1} before any file header")
            m = _HUNK.match(line)
            if not m:
                raise PatchError(f"{cur.path}: unreadable hunk header {line[:80]!r}")
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            old_lines: list[bytes] = []
            new_lines: list[bytes] = []
            old_eof = new_eof = False
            i += 1
            while i < len(lines) and (len(old_lines) < old_n or len(new_lines) < new_n or lines[i].startswith(b"\\")):
                body = lines[i]
                tag, text = body[:1], body[1:]
                if tag == b"\\":
                    # "\ No newline at end of file" applies to the line just before it.
                    prev = lines[i - 1][:1]
                    if prev in (b" ", b"-", b""):
                        old_eof = True
                    if prev in (b" ", b"+", b""):
                        new_eof = True
                elif tag in (b" ", b""):
                    old_lines.append(text)
                    new_lines.append(text)
                elif tag == b"-":
                    old_lines.append(text)
                elif tag == b"+":
                    new_lines.append(text)
                else:
                    raise PatchError(f"{cur.path}: unexpected line in a hunk: {body[:80]!r}")
                i += 1
            if len(old_lines) != old_n or len(new_lines) != new_n:
                raise PatchError(f"{cur.path}: hunk {line.decode('utf-8', 'replace')} is truncated")
            cur.hunks.append((int(m.group(1)), old_lines, new_lines, old_eof, new_eof))
            continue
        i += 1
    if not files:
        raise PatchError("no file in the patch")
    return files


def _split(data: bytes) -> tuple[list[bytes], bool]:
    if not data:
        return [], True
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
        return lines, True
    return lines, False


def _apply_hunks(fp: FilePatch, data: bytes) -> bytes:
    lines, ends_with_newline = _split(data)
    offset = 0
    for start, old, new, old_eof, new_eof in fp.hunks:
        want = max(start - 1 + offset, 0) if old else max(start + offset, 0)
        found = -1
        for delta in range(len(lines) + 1):
            for at in (want - delta, want + delta):
                if 0 <= at <= len(lines) - len(old) and lines[at : at + len(old)] == old:
                    found = at
                    break
            if found >= 0:
                break
        if found < 0:
            raise PatchError(f"{fp.path}: a hunk at line {start} does not match the file")
        lines[found : found + len(old)] = new
        # Where the next hunk's old lines are now: this hunk's drift, plus what it added.
        offset = found - (start - 1 if old else start) + len(new) - len(old)
        if found + len(new) == len(lines):
            if new_eof:
                ends_with_newline = False
            elif old_eof or new:
                ends_with_newline = True
    out = b"\n".join(lines)
    return out + b"\n" if lines and ends_with_newline else out


def apply_patch(patch: bytes, files: Mapping[str, bytes | None]) -> dict[str, tuple[bytes | None, int | None]]:
    """New content and mode (``None``: keep) of every file the patch touches.

    Args:
        patch: a unified diff.
        files: current content of the files it touches (missing or ``None``: the file does not exist).
    Raises:
        PatchError: the patch does not apply (the message names the file).
    """
    return apply_file_patches(parse_patch(patch), files)


def apply_file_patches(
    file_patches: Iterable[FilePatch], files: Mapping[str, bytes | None]
) -> dict[str, tuple[bytes | None, int | None]]:
    """``apply_patch`` of parsed file patches (some of a patch's hunks, say)."""
    out: dict[str, tuple[bytes | None, int | None]] = {}
    current = dict(files)
    for fp in file_patches:
        source = fp.old_path
        before = current.get(source) if source is not None else None
        if source is not None and before is None:
            raise PatchError(f"{source}: the patch changes a file that does not exist")
        if source is None and fp.new_path is not None and current.get(fp.new_path) is not None:
            raise PatchError(f"{fp.new_path}: the patch creates a file that already exists")
        if fp.new_path is None:
            out[source or ""] = (None, None)
            current[source or ""] = None
            continue
        after = _apply_hunks(fp, before or b"")
        if source is not None and source != fp.new_path:
            out[source] = (None, None)
            current[source] = None
        out[fp.new_path] = (after, fp.mode)
        current[fp.new_path] = after
    return out


def patch_paths(patch: bytes) -> list[str]:
    """Every path a patch reads or writes (old and new names)."""
    paths: list[str] = []
    for fp in parse_patch(patch):
        for p in (fp.old_path, fp.new_path):
            if p and p not in paths:
                paths.append(p)
    return paths


_SWAP_HEADERS = (
    (b"new file mode ", b"deleted file mode "),
    (b"old mode ", b"new mode "),
    (b"rename from ", b"rename to "),
)


def reverse_patch(patch: bytes) -> bytes:
    """The diff that undoes ``patch`` (what ``git apply --reverse`` applies), in the same format.

    SWE-smith publishes the diff that puts the bug in: the fix is its reverse. Raises PatchError for
    what has no textual reverse here (binary patches, copies) or what is unreadable."""
    lines = patch.split(b"\n")
    out: list[bytes] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith((b"GIT binary patch", b"Binary files ")):
            raise PatchError("binary patch: no reverse")
        if line.startswith((b"copy from ", b"copy to ")):
            raise PatchError("a copy has no reverse (it would be a deletion)")
        if line.startswith(b"diff --git "):
            m = re.match(rb"^diff --git (a/\S+) (b/\S+)$", line)
            out.append(b"diff --git a/" + m.group(2)[2:] + b" b/" + m.group(1)[2:] if m else line)
        elif line.startswith(b"index ") and b".." in line:
            words = line.split(b" ")
            old, _, new = words[1].partition(b"..")
            out.append(b" ".join([b"index", new + b".." + old, *words[2:]]))
        elif any(line.startswith(a) or line.startswith(b) for a, b in _SWAP_HEADERS):
            for a, b in _SWAP_HEADERS:
                if line.startswith(a):
                    out.append(b + line[len(a) :])
                    break
                if line.startswith(b):
                    out.append(a + line[len(b) :])
                    break
        elif line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            old, new = line[4:], lines[i + 1][4:]
            out += [b"--- " + _other_side(new, b"a/"), b"+++ " + _other_side(old, b"b/")]
            i += 1
        elif line.startswith(b"@@"):
            m = _HUNK.match(line)
            if not m:
                raise PatchError(f"unreadable hunk header {line[:80]!r}")
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            sides = [m.group(k) + (b"," + m.group(k + 1) if m.group(k + 1) is not None else b"") for k in (1, 3)]
            out.append(b"@@ -" + sides[1] + b" +" + sides[0] + b" @@" + line[m.end() :])
            seen_old = seen_new = 0
            i += 1
            while i < len(lines) and (seen_old < old_n or seen_new < new_n or lines[i].startswith(b"\\")):
                body = lines[i]
                tag = body[:1]
                if tag == b"-":
                    seen_old += 1
                    out.append(b"+" + body[1:])
                elif tag == b"+":
                    seen_new += 1
                    out.append(b"-" + body[1:])
                elif tag in (b" ", b""):
                    seen_old += 1
                    seen_new += 1
                    out.append(body)
                elif tag == b"\\":
                    out.append(body)
                else:
                    raise PatchError(f"unexpected line in a hunk: {body[:80]!r}")
                i += 1
            if seen_old != old_n or seen_new != new_n:
                raise PatchError(f"hunk {line.decode('utf-8', 'replace')} is truncated")
            continue
        else:
            out.append(line)
        i += 1
    return b"\n".join(out)


def _other_side(name: bytes, prefix: bytes) -> bytes:
    """A ``---``/``+++`` file name moved to the other side: its a/ or b/ prefix follows it."""
    if name.startswith((b"a/", b"b/")):
        return prefix + name[2:]
    return name
