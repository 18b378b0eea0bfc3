"""The adapters whose frameworks cannot be installed here (slime: not on PyPI; rLLM: no Python 3.11
distribution; harbor: Python >= 3.12) follow those frameworks' published interfaces: the
signatures below are written down from them (slime ``slime/agent/sandbox.py``, rLLM
``rllm/sandbox/protocol.py``, harbor 0.26 ``harbor/environments/base.py``), and a download from a
hostile sandbox cannot write outside its folder, whatever tar stream the sandbox makes up."""

from __future__ import annotations

import inspect
import io
import tarfile
from pathlib import Path

import pytest
from rlsandbox.integrations import harbor, rllm, slime, transfer

P = inspect.Parameter
KW, POS = P.KEYWORD_ONLY, P.POSITIONAL_OR_KEYWORD
E = P.empty

# name -> [(parameter, kind, default)], self left out.
SLIME = {
    "exec": [
        ("cmd", POS, E),
        ("user", KW, "root"),
        ("env", KW, None),
        ("timeout", KW, 120),
        ("check", KW, False),
        ("idempotent", KW, True),  # since slime's 2026-07 sandbox RPC robustness change
    ],
    "write_file": [("sandbox_path", POS, E), ("content", POS, E), ("user", KW, "root")],
    "read_file": [("sandbox_path", POS, E), ("user", KW, "root")],
}
RLLM = {  # rllm 0.3.0.pre (2026-08); start_agent_process and get_endpoint: rllm <= 0.2, kept
    "exec": [("command", POS, E), ("timeout", POS, None), ("user", POS, None)],
    "upload_file": [("local_path", POS, E), ("remote_path", POS, E)],
    "upload_dir": [("local_path", POS, E), ("remote_path", POS, E)],
    "is_alive": [],
    "close": [],
    "start_agent_process": [("command", POS, E), ("port", POS, E)],
    "get_endpoint": [("port", POS, E)],
}

HARBOR = {
    "start": [("force_build", POS, E)],
    "stop": [("delete", POS, E)],
    "exec": [("command", POS, E), ("cwd", POS, None), ("env", POS, None), ("timeout_sec", POS, None), ("user", POS, None)],
    "upload_file": [("source_path", POS, E), ("target_path", POS, E)],
    "upload_dir": [("source_dir", POS, E), ("target_dir", POS, E)],
    "download_file": [("source_path", POS, E), ("target_path", POS, E)],
    "download_dir": [("source_dir", POS, E), ("target_dir", POS, E)],
}


def signature(cls: type, name: str) -> list[tuple[str, object, object]]:
    params = list(inspect.signature(getattr(cls, name)).parameters.values())[1:]
    return [(p.name, p.kind, p.default) for p in params]


@pytest.mark.parametrize(
    ("cls", "protocol"),
    [(slime.RlsandboxSandbox, SLIME), (rllm.RlsandboxSandbox, RLLM), (harbor.RlsandboxEnvironment, HARBOR)],
)
def test_adapters_have_their_frameworks_signatures(cls: type, protocol: dict[str, list[tuple[str, object, object]]]) -> None:
    for name, expected in protocol.items():
        assert signature(cls, name) == expected, name


def test_slime_sandbox_is_an_async_context_manager_with_an_id() -> None:
    sb = slime.RlsandboxSandbox("some-image", target="127.0.0.1:1")
    assert sb.sandbox_id == ""  # set by __aenter__
    assert inspect.iscoroutinefunction(sb.__aenter__) and inspect.iscoroutinefunction(sb.__aexit__)
    assert all(inspect.iscoroutinefunction(getattr(sb, name)) for name in SLIME)


def test_harbor_environment_is_async_and_names_its_type() -> None:
    assert harbor.RlsandboxEnvironment.type() == "rlsandbox"
    assert isinstance(inspect.getattr_static(harbor.RlsandboxEnvironment, "type"), staticmethod)
    assert all(inspect.iscoroutinefunction(getattr(harbor.RlsandboxEnvironment, name)) for name in HARBOR)


def test_harbor_image_and_workdir_are_what_the_importer_uses(tmp_path: Path) -> None:
    from rlsandbox.daemon.grading.importers import from_harbor
    from rlsandbox.integrations.harbor_tasks import dockerfile_workdir, harbor_image, harbor_task_id, task_name

    folder = Path(__file__).resolve().parent.parent / "fixtures" / "harbor" / "fix-greeting"
    spec, built = from_harbor(folder)
    assert built is not None and spec.image == built.tag == harbor_image(folder, harbor_task_id(folder, task_name(folder)))
    assert spec.workspace.path == dockerfile_workdir((folder / "environment" / "Dockerfile").read_text()) == "/app"
    assert dockerfile_workdir("FROM x\nWORKDIR /a\nWORKDIR b\n") == "/a/b" and dockerfile_workdir("FROM x") == ""


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buf.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


def test_a_hostile_tar_writes_only_regular_files_inside_the_folder(tmp_path: Path) -> None:
    dest, outside = tmp_path / "dl", tmp_path / "outside"
    outside.mkdir()
    data = tar_of(
        (member("./ok.txt"), b"ok"),
        (member("./sub/deep.txt", mode=0o4755), b"deep"),
        (member("../climb.txt"), b"x"),
        (member("sub/../../climb2.txt"), b"x"),
        (member(str(outside / "abs.txt")), b"x"),
        (member("link", tarfile.SYMTYPE, str(outside)), b""),
        (member("link/through.txt"), b"x"),
        (member("hard", tarfile.LNKTYPE, "/etc/passwd"), b""),
        (member("dev", tarfile.CHRTYPE), b""),
        (member("fifo", tarfile.FIFOTYPE), b""),
    )
    written = transfer.extract_regular_files(data, dest)
    rel = sorted(str(Path(p).relative_to(dest)) for p in written)
    assert rel == ["link/through.txt", "ok.txt", "sub/deep.txt"]
    assert not (dest / "link").is_symlink()  # links are never made: the later file lands in a real folder
    assert list(outside.iterdir()) == [] and not (tmp_path / "climb.txt").exists() and not (tmp_path / "climb2.txt").exists()
    assert (dest / "sub" / "deep.txt").stat().st_mode & 0o7777 == 0o755  # no setuid from the sandbox
    assert not (dest / "hard").exists() and not (dest / "dev").exists() and not (dest / "fifo").exists()


def test_a_download_never_writes_through_a_symlink_already_in_the_folder(tmp_path: Path) -> None:
    dest, outside = tmp_path / "dl", tmp_path / "outside"
    outside.mkdir()
    dest.mkdir()
    (dest / "sub").symlink_to(outside)
    (dest / "file").symlink_to(outside / "target")
    with pytest.raises(ValueError, match="symlink"):
        transfer.extract_regular_files(tar_of((member("sub/x.txt"), b"x")), dest)
    transfer.extract_regular_files(tar_of((member("file"), b"replaced")), dest)
    assert list(outside.iterdir()) == [] and (dest / "file").read_bytes() == b"replaced" and not (dest / "file").is_symlink()
