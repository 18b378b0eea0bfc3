"""The one ``rlsandbox`` command line, with subcommands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from rlsandbox.daemon import logs
from rlsandbox.daemon.errors import SandboxError

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


async def _images_build(args: argparse.Namespace) -> int:
    from rlsandbox.daemon.images import ImageBuilder, default_images_dir
    from rlsandbox.daemon.runtime.docker import DockerRuntime

    images_dir = args.images_dir or default_images_dir()
    async with DockerRuntime(owner="images", socket_path=args.docker_socket) as runtime:
        builder = ImageBuilder(runtime, images_dir, progress=lambda line: print(line, flush=True))
        outcomes = await builder.build(args.names or None, force=args.force)
    built = sum(o.built for o in outcomes)
    print(f"{len(outcomes)} images: {built} built, {len(outcomes) - built} up to date")
    return 0


async def _images_list(args: argparse.Namespace) -> int:
    from rlsandbox.daemon.images import default_images_dir, load_images
    from rlsandbox.daemon.images.builder import LABEL_INPUT_HASH
    from rlsandbox.daemon.runtime.docker import DockerRuntime

    specs = load_images(args.images_dir or default_images_dir())
    async with DockerRuntime(owner="images", socket_path=args.docker_socket) as runtime:
        print(f"{'name':<14} {'kind':<11} {'tag':<32} inputs")
        for name, spec in specs.items():
            labels = await runtime.images.labels(spec.tag)
            state = "missing" if labels is None else labels.get(LABEL_INPUT_HASH, "?")[:12]
            print(f"{name:<14} {spec.kind:<11} {spec.tag:<32} {state}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlsandbox", description="Sandboxed episodes for agent RL.")
    parser.add_argument(
        "--log-level", default="INFO", help="INFO, or a level per component: INFO,pool=DEBUG,grading=WARNING (default INFO)"
    )
    parser.add_argument(
        "--log-format", default="auto", choices=("auto", "json", "text"), help="JSON lines, or text (auto: text on a terminal)"
    )
    parser.add_argument("--docker-socket", default="/var/run/docker.sock", help="Docker engine socket")
    sub = parser.add_subparsers(dest="command", required=True)

    images = sub.add_parser("images", help="build and list the sandbox images")
    images_sub = images.add_subparsers(dest="images_command", required=True)
    build = images_sub.add_parser("build", help="build every image (or the named ones), skipping up-to-date ones")
    build.add_argument("names", nargs="*", help="images to build (default: all of images.toml)")
    build.add_argument("--force", action="store_true", help="rebuild even when the inputs did not change")
    build.add_argument("--images-dir", type=Path, default=None, help="folder with images.toml")
    build.set_defaults(handler=_images_build)
    lst = images_sub.add_parser("list", help="show the images and whether they are built")
    lst.add_argument("--images-dir", type=Path, default=None)
    lst.set_defaults(handler=_images_list)

    from rlsandbox.daemon import cli_events, cli_serve, cli_tasks

    cli_serve.add_commands(sub)
    cli_tasks.add_commands(sub)
    cli_events.add_commands(sub)
    try:  # the harness ships in rlsandbox-loadtest, which a production node need not install
        from rlsandbox.loadtest import cli as loadtest_cli
    except ImportError:
        pass
    else:
        loadtest_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from rlsandbox.client import SandboxRPCError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        logs.configure(args.log_level, args.log_format)
    except ValueError as e:
        parser.error(str(e))
    handler: Handler = args.handler
    try:
        import uvloop

        return uvloop.run(handler(args))
    except SandboxError as e:
        print(f"rlsandbox: {e}", file=sys.stderr)
        return 2
    except SandboxRPCError as e:  # a daemon the command asked: one line, what it said (not a traceback)
        print(f"rlsandbox: {getattr(args, 'target', 'the daemon')}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
