"""The overlay diff walked on the host (runtime/overlay.py) over crafted layers: what is added,
changed and deleted, links never followed into the host, limits and names it cannot vouch for.
Parity with the engine's own diff on real containers: tests/integration/test_fork.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rlsandbox.daemon.errors import FileTooLarge
from rlsandbox.daemon.runtime.overlay import ADDED, CHANGED, DELETED, layer_dirs, overlay_changes

LIMIT = 1 << 20


def layers(tmp_path: Path) -> tuple[Path, Path]:
    upper, lower = tmp_path / "upper", tmp_path / "lower"
    (lower / "etc").mkdir(parents=True)
    (lower / "etc" / "motd").write_text("image\n")
    (upper / "etc").mkdir(parents=True)
    return upper, lower


def test_added_changed_and_deleted_paths_are_told_apart(tmp_path: Path) -> None:
    upper, lower = layers(tmp_path)
    (upper / "etc" / "motd").write_text("mine\n")
    (upper / "etc" / "new.conf").write_text("x\n")
    (upper / "work" / "deep").mkdir(parents=True)
    (upper / "work" / "deep" / "f").write_text("f\n")
    if os.geteuid() == 0:  # a whiteout is a 0:0 character device, made by root only
        (lower / "etc" / "issue").write_text("image\n")
        os.mknod(upper / "etc" / "issue", 0o600 | 0o020000, os.makedev(0, 0))
    got = dict(overlay_changes(str(upper), [str(lower)], LIMIT) or [])
    assert got["/etc"] == CHANGED and got["/etc/motd"] == CHANGED and got["/etc/new.conf"] == ADDED
    assert got["/work"] == ADDED and got["/work/deep/f"] == ADDED
    if os.geteuid() == 0:
        assert got["/etc/issue"] == DELETED


def test_a_link_in_a_lower_layer_is_never_followed_into_the_host(tmp_path: Path) -> None:
    """A lower layer's ``a -> /etc``: the layer's ``a/passwd`` is new, not the host's /etc/passwd changed."""
    upper, lower = layers(tmp_path)
    (lower / "a").symlink_to("/etc")
    (upper / "a").mkdir()
    (upper / "a" / "passwd").write_text("x\n")
    got = dict(overlay_changes(str(upper), [str(lower)], LIMIT) or [])
    assert got["/a"] == CHANGED and got["/a/passwd"] == ADDED


def test_a_layer_too_big_or_not_utf8_is_left_to_the_engine(tmp_path: Path) -> None:
    upper, lower = layers(tmp_path)
    for i in range(50):
        (upper / "etc" / f"f{i}").write_text("x")
    with pytest.raises(FileTooLarge, match="over 800 bytes"):  # ~20 paths
        overlay_changes(str(upper), [str(lower)], 800)
    (upper / "etc").joinpath(os.fsdecode(b"bad\xff")).write_text("x")
    assert overlay_changes(str(upper), [str(lower)], LIMIT) is None


def test_only_readable_overlay2_layers_are_walked(tmp_path: Path) -> None:
    upper, lower = layers(tmp_path)
    data = {"UpperDir": str(upper), "LowerDir": f"{lower}:{tmp_path}"}
    assert layer_dirs({"GraphDriver": {"Name": "overlay2", "Data": data}}) == (str(upper), [str(lower), str(tmp_path)])
    assert layer_dirs({"GraphDriver": {"Name": "btrfs", "Data": data}}) is None
    gone = {"UpperDir": str(tmp_path / "gone"), "LowerDir": str(lower)}
    assert layer_dirs({"GraphDriver": {"Name": "overlay2", "Data": gone}}) is None
    assert layer_dirs({}) is None


def test_a_folder_renamed_through_redirect_dir_is_left_to_the_engine(tmp_path: Path) -> None:
    """With overlay's redirect_dir, a renamed folder keeps its files in the lower layers: the layer
    alone cannot list them, so the walk gives up (the engine's diff is used)."""
    upper, lower = layers(tmp_path)
    (upper / "opt" / "moved").mkdir(parents=True)
    try:
        os.setxattr(upper / "opt" / "moved", "trusted.overlay.redirect", b"/usr/share/doc")
    except OSError:
        pytest.skip("trusted xattrs need root on a filesystem that keeps them")
    assert overlay_changes(str(upper), [str(lower)], LIMIT) is None


def test_an_opaque_folder_hides_what_the_image_had_in_it(tmp_path: Path) -> None:
    """``rm -rf /etc && mkdir /etc``: the image's files in it are deleted, the layer's are new."""
    upper, lower = layers(tmp_path)
    (upper / "etc" / "mine.conf").write_text("x\n")
    try:
        os.setxattr(upper / "etc", "trusted.overlay.opaque", b"y")
    except OSError:
        pytest.skip("trusted xattrs need root on a filesystem that keeps them")
    got = dict(overlay_changes(str(upper), [str(lower)], LIMIT) or [])
    assert got == {"/etc": CHANGED, "/etc/motd": DELETED, "/etc/mine.conf": ADDED}


def test_a_folder_swapped_for_a_link_mid_walk_never_leads_into_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox replaces a folder the walk has listed, but not yet entered, by a link to a host
    folder: the walk does not go through it (it used to list the host's files as changes)."""
    from rlsandbox.daemon.runtime import overlay

    upper, lower = layers(tmp_path)
    (upper / "a" / "b").mkdir(parents=True)
    host = tmp_path / "host"
    (host / "b").mkdir(parents=True)
    (host / "b" / "secret").write_text("host\n")
    real_open = overlay._open_folder

    def swapped(path: bytes) -> int | None:
        if path.endswith(b"/a/b") and (upper / "a").is_dir() and not (upper / "a").is_symlink():
            (upper / "a" / "b").rmdir()
            (upper / "a").rmdir()
            (upper / "a").symlink_to(host)  # what `rm -rf a && ln -s / a` does, mid-walk
        return real_open(path)

    monkeypatch.setattr(overlay, "_open_folder", swapped)
    got = dict(overlay_changes(str(upper), [str(lower)], LIMIT) or [])
    assert "/a/b/secret" not in got and got["/a/b"] == ADDED
    assert real_open(os.fsencode(upper / "a" / "b")) is None  # reached through a link: refused


def test_a_deep_tree_of_long_paths_is_bounded_by_their_bytes(tmp_path: Path) -> None:
    """Few paths, each thousands of bytes long (a deep tree): what the daemon holds is bounded by
    the bytes of the paths, not only by their number."""
    upper, lower = layers(tmp_path)
    deep = upper / "d"
    for _ in range(30):
        deep = deep / ("x" * 100)
    deep.mkdir(parents=True)
    for i in range(20):
        (deep / f"f{i}").write_text("x")
    with pytest.raises(FileTooLarge, match="over 40000 bytes"):  # 50 paths, ~3 KB each at the bottom
        overlay_changes(str(upper), [str(lower)], 40_000)
    assert len(overlay_changes(str(upper), [str(lower)], LIMIT) or []) == 52


def test_a_folder_of_millions_is_never_listed_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk stops inside a folder's listing once past its bound, instead of holding it all."""
    upper, lower = layers(tmp_path)
    st = os.lstat(upper / "etc")
    taken = 0
    real_scandir = os.scandir

    class Entry:
        def __init__(self, i: int) -> None:
            self.name = f"f{i}"

        def stat(self, *, follow_symlinks: bool) -> os.stat_result:
            return os.stat_result((0o100644, *st[1:]))

    class Millions:
        def __enter__(self) -> Millions:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def __iter__(self):  # type: ignore[no-untyped-def]
            nonlocal taken
            for i in range(10**7):
                taken += 1
                yield Entry(i)

    monkeypatch.setattr(os, "scandir", lambda fd: Millions() if taken == 0 else real_scandir(fd))
    with pytest.raises(FileTooLarge):
        overlay_changes(str(upper), [str(lower)], LIMIT)
    assert taken < 40_000  # ~1 MiB of paths at ~40 bytes each, not ten million
