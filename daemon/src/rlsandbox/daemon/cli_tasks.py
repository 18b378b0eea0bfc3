"""`rlsandbox tasks ...`: validate tasks through a daemon, print the task JSON Schema, import SWE-bench."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlsandbox.daemon.errors import FailedPrecondition, InvalidArgument

DEFAULT_TARGET = os.environ.get("RLSANDBOX_TARGET", "127.0.0.1:7420")


def _load(path: str, **limits: int) -> list[Any]:
    """The tasks of a task file or folder; a task that cannot be used is the command's error."""
    from rlsandbox.daemon.grading.task import TaskError, load_tasks

    try:
        return load_tasks(path, **limits)
    except TaskError as e:
        raise InvalidArgument(str(e)) from None


async def _validate(args: argparse.Namespace) -> int:
    from rlsandbox.client import AsyncClient
    from rlsandbox.daemon.grading.validate import Progress, summary_table, validate, write_cleaned

    tasks = _load(args.path)
    if args.runs < 1 or args.concurrency < 1:
        raise InvalidArgument("--runs and --concurrency must be at least 1")
    jobs = sum(args.runs * (2 if t.spec.gold_patch else 1) for t in tasks)
    print(f"validating {len(tasks)} tasks, {args.runs} run(s) each, {jobs} gradings, through {args.target}", file=sys.stderr)
    progress = Progress(jobs)
    async with AsyncClient(args.target, timeout=120) as client:
        report = await validate(
            client,
            tasks,
            runs=args.runs,
            concurrency=args.concurrency,
            exclude_flaky=args.exclude_flaky,
            progress=progress.update,
        )
    print(summary_table(report))
    if args.report:
        Path(args.report).write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")
        print(f"report: {args.report}")
    if args.out:
        n = write_cleaned(tasks, report, Path(args.out))
        print(f"cleaned task set: {n} task(s) in {args.out}")
    return 0 if all(v.usable for v in report.tasks) else 1


async def _audit(args: argparse.Namespace) -> int:
    from rlsandbox.client import AsyncClient
    from rlsandbox.daemon.grading.audit import audit, audit_table

    tasks = _load(args.path)
    if args.concurrency < 1 or args.max_patches < 0:
        raise InvalidArgument("--concurrency must be at least 1 and --max-patches at least 0")
    print(f"auditing {len(tasks)} task(s) through {args.target}", file=sys.stderr)
    done = [0]

    def progress(verdict: Any) -> None:
        done[0] += 1
        print(f"[{done[0]}/{len(tasks)}] {verdict.task_id}: {verdict.verdict}", file=sys.stderr)

    async with AsyncClient(args.target, timeout=120) as client:
        report = await audit(client, tasks, concurrency=args.concurrency, max_patches=args.max_patches, progress=progress)
    print(audit_table(report))
    if args.report:
        Path(args.report).write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")
        print(f"report: {args.report}")
    if args.out:
        from rlsandbox.daemon.grading.validate import write_tasks

        strong = {v.task_id for v in report.tasks if v.verdict == "strong"}
        n = write_tasks([t for t in tasks if t.id in strong], Path(args.out))
        print(f"clean task set: {n} task(s) in {args.out}")
    return 0 if all(v.verdict == "strong" for v in report.tasks) else 1


async def _mine(args: argparse.Namespace) -> int:
    import time

    from rlsandbox.client import AsyncClient
    from rlsandbox.daemon.grading.mine import MiningError, candidates, mine
    from rlsandbox.daemon.grading.validate import write_tasks

    repo = Path(args.repo)
    if not (repo / ".git").exists():
        raise InvalidArgument(f"--repo {repo}: not a git clone (no .git)")
    try:
        found = candidates(repo, args.revisions, args.max_commits)
    except MiningError as e:
        raise InvalidArgument(str(e)) from None
    print(f"{len(found)} commit(s) change code and tests; running their tests {args.runs} time(s) each side", file=sys.stderr)
    started = time.monotonic()

    def progress(m: Any) -> None:
        said = f"a task, {len(m.task.spec.evaluation.fail_to_pass)} FAIL_TO_PASS" if m.task else m.reason
        print(f"{m.commit[:12]}: {said}", file=sys.stderr)

    env = dict(_key_value(kv) for kv in args.env or [])
    async with AsyncClient(args.target, timeout=300) as client:
        mined = await mine(
            client, repo, pool=args.pool or "", image=args.image or "", revisions=args.revisions,
            max_count=args.max_commits, runs=args.runs,
            concurrency=args.concurrency, workspace_path=args.workspace, env=env,
            **({"test_command": args.test_command} if args.test_command else {}),
        )  # fmt: skip
    tasks = [m.task for m in mined if m.task is not None]
    written = write_tasks(tasks, Path(args.out))
    hours = (time.monotonic() - started) / 3600
    print(f"{written} task(s) from {len(found)} commit(s) in {args.out} ({written / hours:.0f} tasks/hour)")
    return 0


async def _schema(args: argparse.Namespace) -> int:
    from rlsandbox.daemon.grading.task import json_schema

    text = json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


DATASET_SUFFIXES = (".jsonl", ".json", ".parquet")


def read_records(src: Path, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """The records of a dataset file as published (JSONL, a JSON list or object, Parquet) or of a
    folder of such files (in name order). Raises InvalidArgument saying which file and line; with
    ``skipped``, a JSONL line that is not a JSON object is left out and said there instead."""
    if src.is_dir():
        files = sorted(p for p in src.iterdir() if p.is_file() and p.name.endswith(DATASET_SUFFIXES))
        if not files:
            raise InvalidArgument(f"{src}: a folder without dataset files ({', '.join(DATASET_SUFFIXES)})")
        return [r for f in files for r in read_records(f, skipped)]
    if not src.is_file():
        raise InvalidArgument(f"{src}: no such file or folder")
    if src.suffix == ".parquet":
        return _parquet_records(src)
    try:
        text = src.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"{src}: not UTF-8 text: give JSON, JSONL or a .parquet file") from None
    if src.suffix == ".json":
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise InvalidArgument(f"{src}: not JSON: {e}") from None
        docs = doc if isinstance(doc, list) else [doc]
    else:
        docs = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    doc = json.loads(line)
                except ValueError as e:
                    if skipped is None:
                        raise InvalidArgument(f"{src}:{n}: not a JSON line: {e}") from None
                    skipped.append(f"{src}:{n}: not a JSON line: {e}")
                    continue
                if not isinstance(doc, dict) and skipped is not None:
                    skipped.append(f"{src}:{n}: not a JSON object")
                    continue
                docs.append(doc)
    if not all(isinstance(d, dict) for d in docs):
        raise InvalidArgument(f"{src}: every record must be a JSON object")
    return docs


def _parquet_records(src: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidArgument(
            f"{src}: reading Parquet needs pyarrow: pip install 'rlsandbox-daemon[datasets]' (or pyarrow)"
        ) from None
    try:
        rows: list[dict[str, Any]] = pq.read_table(src).to_pylist()
    except Exception as e:  # pyarrow's own errors (ArrowInvalid, OSError) for a damaged or foreign file
        raise InvalidArgument(f"{src}: not a readable Parquet file: {e}") from None
    return rows


async def _import_swebench(args: argparse.Namespace) -> int:
    from rlsandbox.daemon.grading.importers import from_swebench, record_variant

    skipped: list[str] = []  # records left out, each with its reason (all of them, with --strict: none)
    docs = read_records(Path(args.path), None if args.strict else skipped)
    env = dict(_key_value(kv) for kv in args.env or [])
    if args.repo and args.out in (None, "-"):
        raise InvalidArgument("--repo writes a workspace tarball per instance beside --out: give --out FILE.jsonl")
    if args.repo and not Path(args.repo, ".git").exists() and not Path(args.repo, "HEAD").is_file():
        raise InvalidArgument(f"--repo {args.repo}: not a git clone (no .git)")
    # With --repo the workspace is copied in, into the pool's image's usual place; else it is the
    # image's own repository, at SWE-bench's place.
    workspace = args.workspace or ("/workspace" if args.repo else "/testbed")
    out_path = Path(args.out).resolve() if args.out not in (None, "-") else None
    written: list[Path] = []  # what this run wrote: removed again if it fails
    lines: list[str] = []
    try:
        for doc in docs:
            mine = len(written)
            try:
                tar = _archive_base_commit(args.repo, doc, out_path, written) if args.repo and out_path else None
                r2egym = args.variant == "r2e-gym" or (args.variant == "auto" and record_variant(doc) == "r2e-gym")
                tests = await _r2egym_image_tests(doc, args) if args.tests_from_image and r2egym else None
                spec = from_swebench(
                    doc,
                    pool=args.pool or "",
                    image=args.image or "",
                    workspace_path=workspace,
                    test_command=args.test_command,
                    env=env,
                    workspace_tar=tar,
                    variant=args.variant,
                    report_format=args.report_format,
                    tests=tests,
                )
            except (ValueError, InvalidArgument) as e:  # TaskError, the task format's own check, git archive
                if args.strict:
                    raise InvalidArgument(str(e)) from None
                for path in written[mine:]:  # this record's tarball, not the folder others share
                    if not path.is_dir():
                        path.unlink(missing_ok=True)
                        written.remove(path)
                iid = doc.get("instance_id") if isinstance(doc, dict) else None
                skipped.append(f"{iid or 'a record'}: {e}" if iid and not str(e).startswith(str(iid)) else str(e))
                continue
            lines.append(spec.model_dump_json(exclude_none=True) + "\n")
        for why in skipped:
            print(f"skipped {why}", file=sys.stderr)
        if skipped and not lines:
            raise InvalidArgument(f"no record could be imported ({len(skipped)} skipped; the first: {skipped[0]})")
        if out_path is None:
            sys.stdout.writelines(lines)
        else:
            partial = out_path.with_name(out_path.name + ".partial")
            partial.write_text("".join(lines), encoding="utf-8")
            partial.replace(out_path)
    except BaseException:
        for path in reversed(written):  # tarballs, then the folder this run made for them
            if not path.is_dir():
                path.unlink(missing_ok=True)
            elif not any(path.iterdir()):
                path.rmdir()
        raise
    more = f", {len(skipped)} record(s) skipped (listed above; --strict stops at the first)" if skipped else ""
    print(f"{len(lines)} task(s) imported{more}", file=sys.stderr)
    return 0


async def _build_env(args: argparse.Namespace) -> int:
    """An environment image per repository of the tasks (its packages resolved on the host and
    installed offline, content-addressed), and the tasks rewritten to run in it."""
    import os

    from rlsandbox.daemon.grading.task import TaskSpec
    from rlsandbox.daemon.images.environments import build_environment
    from rlsandbox.daemon.runtime.docker import DockerRuntime

    src, out = Path(args.path).resolve(), Path(args.out).resolve()
    requirements = list(args.requirement or [])
    for file in args.requirements_file or []:
        requirements += [ln.split("#", 1)[0].strip() for ln in Path(file).read_text().splitlines() if ln.split("#", 1)[0].strip()]
    if not requirements:
        raise InvalidArgument("give the packages the tests need: --requirement NAME (repeat) or --requirements-file FILE")
    specs: list[TaskSpec] = []
    for n, line in enumerate(src.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                specs.append(TaskSpec.model_validate_json(line))
            except ValueError as e:
                raise InvalidArgument(f"{src}:{n}: not a task: {e}") from None
    built: dict[str, Any] = {}
    async with DockerRuntime(owner="rlsandbox-tasks", instance="build-env") as runtime:
        for spec in specs:
            repo = str(spec.metadata.get("repo") or spec.id)
            if repo not in built:
                print(f"{repo}: resolving {' '.join(requirements)} for Python {args.python} ...", file=sys.stderr)
                env = await build_environment(
                    runtime, repo, requirements, base=args.base, python=args.python,
                    wheelhouse=Path(args.wheelhouse) if args.wheelhouse else None, offline=args.offline,
                )  # fmt: skip
                done = "built" if env.built else "up to date"
                print(f"{repo}: {env.tag} {done} ({len(env.packages)} packages)", file=sys.stderr)
                built[repo] = env
    lines = []
    for spec in specs:
        env = built[str(spec.metadata.get("repo") or spec.id)]
        workspace = spec.workspace
        if workspace.tar and not Path(workspace.tar).is_absolute():  # still found from the new file's folder
            moved = os.path.relpath(src.parent / workspace.tar, out.parent)
            workspace = workspace.model_copy(update={"tar": Path(moved).as_posix()})
        metadata = {**spec.metadata, "environment": {"image": env.tag, "hash": env.env_hash, "packages": list(env.packages)}}
        lines.append(spec.model_copy(update={"pool": "", "image": env.tag, "workspace": workspace, "metadata": metadata}))
    out.write_text("".join(s.model_dump_json(exclude_none=True) + "\n" for s in lines), encoding="utf-8")
    print(f"{len(lines)} task(s) in {len(built)} environment(s): {out}", file=sys.stderr)
    return 0


async def _r2egym_image_tests(doc: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """An R2E-Gym record's tests as its image (local) holds them at /r2e_tests, by path below it."""
    import io
    import tarfile

    from rlsandbox.daemon.grading.importers import R2E_TESTS_IN_IMAGE, instance_image, r2egym_instance_id
    from rlsandbox.daemon.grading.task import TaskError, check_relative
    from rlsandbox.daemon.runtime.docker import DockerRuntime

    if args.pool:
        raise TaskError("--tests-from-image needs each record's image: give --image (a template, or 'field')")
    iid = r2egym_instance_id(doc)
    image = instance_image({**doc, "instance_id": iid}, args.image)
    async with DockerRuntime(owner="rlsandbox-tasks", instance="import") as runtime:
        data = await runtime.image_folder(image, R2E_TESTS_IN_IMAGE, 64 << 20)
    if data is None:
        raise TaskError(f"{iid}: the image {image} has no {R2E_TESTS_IN_IMAGE}")
    tests: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            rel = member.name.partition("/")[2]
            if not member.isfile() or not rel or "__pycache__" in rel.split("/") or rel.endswith(".pyc"):
                continue
            f = tar.extractfile(member)
            try:
                tests[check_relative(rel)] = f.read().decode() if f else ""
            except UnicodeDecodeError:
                raise TaskError(f"{iid}: {R2E_TESTS_IN_IMAGE}/{rel} in {image} is binary (hidden tests are text)") from None
    return tests


async def _import_harbor(args: argparse.Namespace) -> int:
    """Harbor / Terminal-Bench task folders (or folders of them) to tasks (JSONL); with
    ``--build``, their environment images built by the local engine."""
    from rlsandbox.daemon.grading.importers import HarborImage, from_harbor, is_harbor_task
    from rlsandbox.daemon.grading.task import TaskError, TaskSpec

    folders: list[Path] = []
    for given in map(Path, args.paths):
        found = [given] if is_harbor_task(given) else []
        if not found and given.is_dir():
            found = sorted(p for p in given.iterdir() if p.is_dir() and is_harbor_task(p))
        if not found:
            raise InvalidArgument(f"{given}: neither a Harbor task folder (task.toml, instruction.md) nor a folder of them")
        folders.extend(found)
    specs: list[TaskSpec] = []
    builds: list[HarborImage] = []
    for folder in folders:
        try:
            spec, build = from_harbor(folder, image_prefix=args.image_prefix)
        except TaskError as e:
            raise InvalidArgument(str(e)) from None
        specs.append(spec)
        if build is not None:
            builds.append(build)
    if args.build:
        await _build_harbor_images(builds)
    out = sys.stdout if args.out in (None, "-") else open(args.out, "w", encoding="utf-8")  # noqa: SIM115 - stdout is not ours to close
    try:
        for spec in specs:
            out.write(spec.model_dump_json(exclude_none=True) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    built = f", {len(builds)} image(s) built" if args.build else f"; build their {len(builds)} image(s) with --build"
    print(f"{len(specs)} task(s) imported{built if builds else ''}", file=sys.stderr)
    return 0


async def _build_harbor_images(builds: list[Any]) -> None:
    import io
    import tarfile

    from rlsandbox.daemon.runtime.docker import DockerRuntime

    async with DockerRuntime(owner="rlsandbox-tasks", instance="import") as runtime:
        for build in builds:
            tag, context = build.tag, build.context
            if await runtime.images.labels(tag) is not None:
                print(f"{tag}: up to date", file=sys.stderr)
                continue
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(context, arcname=".")
            await runtime.images.build(buf.getvalue(), tag=tag, labels={"rlsandbox.task-image": "harbor"})
            print(f"{tag}: built from {context}", file=sys.stderr)


async def _push(args: argparse.Namespace) -> int:
    """Store tasks in the NATS object store, content-addressed; print their refs (JSONL)."""
    import nats
    from rlsandbox.daemon.events.connection import NatsAuth, servers
    from rlsandbox.daemon.grading.bundles import push
    from rlsandbox.daemon.grading.task import MAX_BUNDLE_WORKSPACE_BYTES

    tasks = _load(args.path, workspace_limit=MAX_BUNDLE_WORKSPACE_BYTES)
    auth = NatsAuth.from_args(args)
    # The server answers a publish the user may not make with an asynchronous error, never an
    # ack: without this, the push would wait out its timeout for every chunk.
    denied: list[str] = []
    refused = asyncio.Event()

    async def on_error(e: Exception) -> None:
        if "permissions violation" in str(e).lower():
            denied.append(str(e))
            refused.set()

    nc = await nats.connect(
        servers(args.nats), name="rlsandbox-tasks-push", connect_timeout=5, error_cb=on_error, **auth.connect_options()
    )
    stored = 0
    try:
        js = nc.jetstream(timeout=120)
        for task in tasks:
            pushing = asyncio.ensure_future(push(js, task))
            waiting = asyncio.ensure_future(refused.wait())
            await asyncio.wait({pushing, waiting}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if not pushing.done():
                pushing.cancel()
                raise FailedPrecondition(
                    f"NATS refused the push ({denied[0]}): push with the trainer's user "
                    "(--nats-user trainer --nats-password-file ...; rlsandbox keys init)"
                )
            ref, new = pushing.result()
            stored += new
            print(json.dumps({"id": task.id, "ref": ref, "bytes": len(task.workspace_tar), "stored": new}))
    finally:
        await nc.close()
    print(f"{len(tasks)} task(s): {stored} stored, {len(tasks) - stored} already there", file=sys.stderr)
    return 0


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise InvalidArgument(f"--env {text!r}: use KEY=VALUE")
    return key, value


def _archive_base_commit(repo: str, doc: dict[str, object], out: Path, written: list[Path]) -> str:
    """The tree of the instance's base_commit in the local clone ``repo``, as a tarball beside
    ``out`` (``git archive``: the files at that commit, no history), added to ``written``.
    Returns its path relative to ``out``'s folder."""
    iid, commit = str(doc.get("instance_id") or ""), str(doc.get("base_commit") or "")
    if not iid or not commit:
        raise InvalidArgument(f"{iid or 'an instance'}: --repo needs instance_id and base_commit")
    folder = out.parent / (out.stem + ".workspaces")
    if not folder.exists():
        folder.mkdir(parents=True)
        written.append(folder)
    target = folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', iid)}.tar"
    written.append(target)
    done = subprocess.run(["git", "-C", repo, "archive", "--format=tar", "-o", str(target), commit], capture_output=True)
    if done.returncode != 0:
        raise InvalidArgument(f"{iid}: git archive of {commit} in {repo} failed: {done.stderr.decode(errors='replace').strip()}")
    return target.relative_to(out.parent).as_posix()


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tasks = sub.add_parser("tasks", help="validate tasks, print the task schema, import SWE-bench instances and Harbor tasks")
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True)

    v = tasks_sub.add_parser("validate", help="check every task through a daemon: empty patch fails, gold patch passes")
    v.add_argument("path", help="a task file (.yaml, .json, .jsonl) or a folder of task*.yaml|json|jsonl files")
    v.add_argument("--runs", type=int, default=3, help="runs per patch, to find flaky tests (default 3)")
    v.add_argument("--concurrency", type=int, default=8, help="gradings at once (default 8)")
    v.add_argument("--exclude-flaky", action="store_true", help="drop flaky tests from the lists instead of rejecting the task")
    v.add_argument("--target", default=DEFAULT_TARGET, help=f"daemon address (default {DEFAULT_TARGET}, or $RLSANDBOX_TARGET)")
    v.add_argument("--report", help="write the JSON report here")
    v.add_argument("--out", help="write the cleaned task set (the valid tasks) into this folder")
    v.set_defaults(handler=_validate)

    au = tasks_sub.add_parser(
        "audit", help="grade cheap wrong patches (hunks left out, changed functions stubbed) against each task: weak tests"
    )
    au.add_argument("path", help="a task file (.yaml, .json, .jsonl) or a folder of task files")
    au.add_argument("--concurrency", type=int, default=8, help="gradings at once (default 8)")
    au.add_argument("--max-patches", type=int, default=24, help="wrong patches per task at most (default 24)")
    au.add_argument("--target", default=DEFAULT_TARGET, help=f"daemon address (default {DEFAULT_TARGET}, or $RLSANDBOX_TARGET)")
    au.add_argument("--report", help="write the JSON report here")
    au.add_argument("--out", help="write the tasks no wrong patch passes into this folder")
    au.set_defaults(handler=_audit)

    mi = tasks_sub.add_parser(
        "mine", help="tasks from a repository's history: commits that change code and tests, their tests run before and after"
    )
    mi.add_argument("--repo", required=True, help="a local git clone")
    where = mi.add_mutually_exclusive_group(required=True)
    where.add_argument("--pool", help="the pool whose image has what the tests need (python: pytest only)")
    where.add_argument("--image", help="an image with what the tests need (tasks build-env's), a pool made on demand")
    mi.add_argument("--revisions", default="HEAD", help="what git rev-list walks (default HEAD; A..B for a range)")
    mi.add_argument("--max-commits", type=int, default=100, help="commits looked at, newest first (default 100)")
    mi.add_argument("--runs", type=int, default=2, help="runs of each side, for flaky tests (default 2)")
    mi.add_argument("--concurrency", type=int, default=4, help="gradings at once (default 4)")
    mi.add_argument("--workspace", default="/workspace", help="where the workspace goes in the sandbox (default /workspace)")
    mi.add_argument("--env", action="append", metavar="KEY=VALUE", help="environment of the tests and the episode; repeat")
    mi.add_argument("--test-command", default=None, help="the test command ({test_files}: the commit's test files)")
    mi.add_argument("--target", default=DEFAULT_TARGET, help=f"daemon address (default {DEFAULT_TARGET}, or $RLSANDBOX_TARGET)")
    mi.add_argument("--out", required=True, help="the folder the tasks are written to (loadable, like validate --out)")
    mi.set_defaults(handler=_mine)

    sc = tasks_sub.add_parser("schema", help="print the JSON Schema of the task format")
    sc.add_argument("--out", help="write it to this file instead")
    sc.set_defaults(handler=_schema)

    sw = tasks_sub.add_parser(
        "import-swebench",
        help="convert dataset records (SWE-bench and its family, Multi-SWE-bench; JSONL, JSON or Parquet) to tasks (JSONL)",
    )
    sw.add_argument("path", help="a dataset file (.jsonl, .json, .parquet) or a folder of them")
    where = sw.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--pool",
        help="the pool the tasks run in: whose image holds the repository at its base commit, or, with --repo, "
        "the environment it needs (python for a pure-Python project whose tests need only pytest)",
    )
    where.add_argument(
        "--image",
        help="each instance's own image (a pool made on demand): a template with {instance_id}, {docker_id} "
        "(SWE-bench's: swebench/sweb.eval.x86_64.{docker_id}:latest), {swegym_id} (SWE-Gym's), {image_name} or "
        "{image_docker_id} (SWE-smith's: jyangballin/{image_docker_id}:latest); or 'field' for the instance's "
        "image_name/docker_image",
    )
    sw.add_argument(
        "--variant",
        choices=("auto", "swebench", "swesmith", "r2e-gym", "multi-swe-bench"),
        default="auto",
        help="the records' layout: swebench (test_patch and the fix: SWE-bench, SWE-Gym, SWE-bench-extra, R2E-Gym's "
        "SWE-bench-style sets), swesmith (the bug patch, tests in the repository), r2e-gym (R2E-Gym's own: "
        "expected_output_json, tests in the image), multi-swe-bench (fix_patch, base.sha, f2p_tests: give "
        "--test-command); auto tells them apart by their fields",
    )
    sw.add_argument(
        "--strict",
        action="store_true",
        help="stop at the first record that cannot be imported (default: skip it, say why on stderr, import the rest)",
    )
    sw.add_argument(
        "--tests-from-image",
        action="store_true",
        help="r2e-gym: read each record's hidden tests from its local image's /r2e_tests (instead of the record's "
        "execution_result_content)",
    )
    sw.add_argument(
        "--workspace",
        default=None,
        help="where the repository is in the sandbox (default /testbed, the datasets' images' place; with --repo "
        "/workspace, the place of the pools' images)",
    )
    sw.add_argument("--repo", help="a local clone: each workspace is its base_commit's tree, copied in")
    sw.add_argument(
        "--env", action="append", metavar="KEY=VALUE", help="environment of the tests and the episode (PYTHONPATH=src); repeat"
    )
    sw.add_argument(
        "--test-command",
        default=None,
        help="the test command; {test_files} is replaced by the patch's test files, {test_modules} by their dotted "
        "modules under tests/ (default: the record's harness: python -m pytest -rA -p no:cacheprovider {test_files}; "
        "Django's ./tests/runtests.py, read as unittest; the eval_script's command for Go and TAP records)",
    )
    sw.add_argument(
        "--report-format",
        default=None,
        help="how the test command's report is read (docs/GRADING.md, 'Reports and test ids'): pytest, gotest, tap, "
        "junit, ... (default: the record's log_parser's)",
    )
    sw.add_argument("--out", help="output JSONL file (default: standard output)")
    sw.set_defaults(handler=_import_swebench)

    be = tasks_sub.add_parser(
        "build-env",
        help="build an environment image per repository of imported tasks (packages from PyPI, resolved on the host, "
        "installed offline) and write the tasks to run in it",
    )
    be.add_argument("path", help="a task file (.jsonl), as import-swebench writes it")
    be.add_argument("--requirement", action="append", metavar="SPEC", help="a package the tests need (pytz, pytest==7.4); repeat")
    be.add_argument("--requirements-file", action="append", metavar="FILE", help="a file of such packages, one a line")
    be.add_argument("--base", default="rlsandbox/python-task:latest", help="the image to build on (default python-task's)")
    be.add_argument("--python", default="3.11", help="the base image's Python version, for the wheels (default 3.11)")
    be.add_argument("--wheelhouse", help="a folder of wheels fetched before, searched first")
    be.add_argument("--offline", action="store_true", help="only the --wheelhouse: no package index")
    be.add_argument("--out", required=True, help="the tasks, each naming its environment's image (JSONL)")
    be.set_defaults(handler=_build_env)

    ps = tasks_sub.add_parser("push", help="store tasks in the NATS object store by ref; print the refs (JSONL)")
    ps.add_argument("path", help="a task file (.yaml, .json, .jsonl) or a folder of task files")
    ps.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS server URL")
    ps.add_argument("--nats-creds", default=None, help="NATS .creds file")
    ps.add_argument("--nats-token-file", default=None, help="file holding the NATS token")
    ps.add_argument("--nats-user", default=None, help="NATS user (the trainer's: rlsandbox keys init)")
    ps.add_argument("--nats-password-file", default=None, help="file holding the NATS user's password")
    ps.add_argument("--nats-tls-ca", default=None, help="CA of the NATS server's certificate")
    ps.set_defaults(handler=_push)

    hb = tasks_sub.add_parser("import-harbor", help="convert Harbor / Terminal-Bench task folders to tasks (JSONL)")
    hb.add_argument("paths", nargs="+", help="task folders, or folders of task folders")
    hb.add_argument("--build", action="store_true", help="build each task's environment/Dockerfile image with the local engine")
    hb.add_argument("--image-prefix", default="rlsandbox-harbor", help="repository prefix of the built images")
    hb.add_argument("--out", help="output JSONL file (default: standard output)")
    hb.set_defaults(handler=_import_harbor)
