"""Telling a whole tarball from one the engine cut short (runtime/docker.py): the engine ends its
archive stream early, with no error, when a file shrinks while it is copied."""

from __future__ import annotations

import io
import tarfile

import pytest
from rlsandbox.daemon.runtime.docker import BLOCK, tarball_is_whole


def tarball(fmt: int) -> tuple[bytes, int]:
    """A tarball with a folder, small files, a long name, a symlink and a file of zeros; and where
    its end-of-archive block starts."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        folder = tarfile.TarInfo("ws")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, data in [("ws/a.txt", b"a\n"), ("ws/" + "long-" * 40 + ".py", b"x" * 700), ("ws/zeros", bytes(4096))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("ws/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "a.txt"
        tar.addfile(link)
        end = buf.tell()
    return buf.getvalue(), end


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_a_whole_tarball_is_whole_and_every_cut_of_it_is_not(fmt: int) -> None:
    data, end = tarball(fmt)
    assert tarball_is_whole(data)
    assert tarball_is_whole(data[: end + BLOCK])  # the end block is enough
    for cut in [*range(0, end + BLOCK, 97), *range(0, end + BLOCK, BLOCK)]:
        assert not tarball_is_whole(data[:cut]), cut


def test_a_member_bigger_than_what_follows_is_a_cut_whatever_the_size_encoding() -> None:
    """A sparse file of 8 GiB and more: its size is in base-256 (GNU) or a PAX record, and the
    zeros of a partial copy never pass for the end of the archive."""
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        info = tarfile.TarInfo("ws/sparse.bin")
        info.size = 10 << 30
        head = info.tobuf(fmt, tarfile.ENCODING, "surrogateescape")
        assert not tarball_is_whole(head + bytes(64 * BLOCK)), fmt
    big = tarfile.TarInfo("ws/big")
    big.size = 3 * BLOCK
    pax = big.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
    assert tarball_is_whole(pax + b"y" * 3 * BLOCK + bytes(2 * BLOCK))
    assert not tarball_is_whole(pax + b"y" * 2 * BLOCK)


def test_garbage_is_not_a_tarball() -> None:
    assert not tarball_is_whole(b"")
    assert not tarball_is_whole(b"\xff" * 4 * BLOCK)


def test_a_file_name_cannot_forge_the_size_of_its_member() -> None:
    """A PAX ``path`` record holds the name as it is, newlines and all: a name carrying what looks
    like a ``size`` record neither hides a cut nor invents one."""
    forged = "ws/" + "n" * 120 + "\n22 size=99999999999\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [(forged, b"x" * 600), ("ws/after.txt", b"after\n")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        end = buf.tell()
    data = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert forged in tar.getnames()
    assert tarball_is_whole(data)
    assert not tarball_is_whole(data[: end - 3 * BLOCK])
