"""`python -m swactor.imagecheck [build|check]`: prove `docker/` without a Docker engine.

Theory of operation. `build` replays the Dockerfile on a bare Debian bookworm root
(`replay.py`) and reports the time it took; `check` (what `just docker-check` runs)
then starts the compose file's services from that image (`compose.py`), waits for the
target service (the orchestrator) to finish the hello-world run, and runs the same
run with `swactor run` on this machine: both must complete and print the same text
from the same number of generated tokens. The host run takes the orchestrator's own
run flags from the compose file (`--prompt`, `--max-tokens`, `--split`, ...: every
flag `swactor run` shares with `swactor orchestrator`, except the identity, address
and event-file flags, which belong to a pool member) and reads the model file from
the replayed image, so the two runs differ only in where the code and its
dependencies were installed and how the processes are spread. The orchestrator offers
its model to the pool (its default), and every node's image holds the same file in its
model cache (`$SWACTOR_MODEL_CACHE`): no container may write there, so a node that
fetched weights instead of finding the file fails the check.

Both need root (chroot, mounts, network namespaces). Exit status: 0 when everything
held, 1 when a step, a service or the comparison failed (the first line after
`FAILED` names it), 2 for bad arguments or a machine that cannot run the check.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from swactor.imagecheck.compose import Compose, ComposeError, Topology, load
from swactor.imagecheck.replay import Image, Replayer, StepFailed
from swactor.imagecheck.rootfs import (
    RootfsError,
    default_cache,
    remove_tree,
    sweep_stale_runs,
)
from swactor.model.paths import MODEL_CACHE_ENV

REPO = Path(__file__).resolve().parents[2]
# Flags of `swactor orchestrator` that make it a pool member, not part of the run.
MEMBER_FLAGS = frozenset({"--key", "--bind", "--seed", "--swim", "--events-file", "--quic",
                          "--node"})
SUMMARY = re.compile(r"prompt (\d+) tokens, generated (\d+)")


def say(text: str) -> None:
    print(f"[docker-check] {text}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m swactor.imagecheck",
        description="Replay docker/Dockerfile on a bare Debian bookworm root (debootstrap, "
        "cached) and, with `check`, run docker/compose.yaml's services from it and compare "
        "their hello-world run with `swactor run` on this machine. Needs root.")
    parser.add_argument("what", nargs="?", choices=("build", "check"), default="check",
                        help="build: replay the image build only; check (default): build, "
                        "then run the compose topology and compare")
    parser.add_argument("--dockerfile", type=Path, default=REPO / "docker" / "Dockerfile",
                        help="the Dockerfile to replay (default docker/Dockerfile; its "
                        "<name>.dockerignore next to it filters the context)")
    parser.add_argument("--context", type=Path, default=REPO,
                        help="build context (default: the repository)")
    parser.add_argument("--compose", type=Path, default=REPO / "docker" / "compose.yaml",
                        help="the compose file whose services run (default "
                        "docker/compose.yaml)")
    parser.add_argument("--service", default="orchestrator",
                        help="the service whose exit ends the run (default orchestrator)")
    parser.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE",
                        help="as docker build --build-arg (repeatable)")
    parser.add_argument("--cache", type=Path, default=default_cache(),
                        help="where the bare root is kept between runs (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=1200.0, metavar="S",
                        help="limit for the compose run, and for the host run (default 1200)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the image layer, containers and logs for inspection")
    parser.add_argument("--log", type=Path, default=None,
                        help="write the build steps' output here (default: stderr)")
    return parser.parse_args(argv)


def build(args: argparse.Namespace, work: Path) -> Image:
    args_map = dict(item.partition("=")[::2] for item in args.build_arg)
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(args.log, "w")) if args.log else sys.stderr
        replayer = Replayer(args.dockerfile.resolve(), args.context.resolve(), work,
                            args.cache, args_map, log=log, say=say)
        image = replayer.replay()
    say(f"image replayed in {image.seconds:.0f}s (base {image.base} stood in for by Debian "
        f"bookworm minbase); entrypoint {list(image.entrypoint)}, cmd {list(image.cmd)}")
    return image


@dataclass(frozen=True)
class RunResult:
    code: int
    text: str
    prompt_tokens: int | None
    generated: int | None


def summary(code: int, stdout: str, stderr: str) -> RunResult:
    found = SUMMARY.findall(stderr)
    prompt, generated = (int(found[-1][0]), int(found[-1][1])) if found else (None, None)
    return RunResult(code, stdout, prompt, generated)


def host_run_argv(argv: Sequence[str], image: Image) -> list[str]:
    """`swactor run` with the run flags of the target's `swactor orchestrator` argv."""
    from swactor.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    orchestrator, run = sub.choices["orchestrator"], sub.choices["run"]
    words = list(argv)
    if len(words) < 2 or Path(words[0]).name != "swactor" or words[1] != "orchestrator":
        raise ComposeError(f"the target service runs {words[:2]}, not `swactor orchestrator`")
    out = ["run"]
    i = 2
    while i < len(words):
        word = words[i]
        name, eq, inline = word.partition("=")
        action = orchestrator._option_string_actions.get(name)
        if action is None:
            raise ComposeError(f"`swactor orchestrator` has no flag {name!r}")
        count = 0 if eq else (action.nargs if isinstance(action.nargs, int) else
                              0 if action.nargs == 0 else 1)
        values = [inline] if eq else words[i + 1:i + 1 + count]
        i += 1 + count
        if name in MEMBER_FLAGS or name not in run._option_string_actions:
            continue
        if name == "--model":
            values = [str(_in_image(image, values[0]))]
        out += [name, *values]
    return out


def _in_image(image: Image, path: str) -> Path:
    for layer in image.layers:
        candidate = layer / path.lstrip("/")
        if candidate.exists():
            return candidate
    raise ComposeError(f"{path} is not in the image")


def check(args: argparse.Namespace, image: Image, work: Path) -> int:
    compose: Compose = load(args.compose.resolve(), image, args.dockerfile.resolve())
    topology = Topology(compose, image, work, say)
    target = compose.services.get(args.service)
    if target is None:
        raise ComposeError(f"no service {args.service!r} in {args.compose}")
    host_argv = host_run_argv(target.argv, image)
    say(f"compose topology: {', '.join(compose.services)} on {compose.subnet}")
    cache = image.env.get(MODEL_CACHE_ENV)
    fetched: dict[str, list[str]] = {}
    try:
        outcome = topology.run(args.service, args.timeout)
        if cache:  # every container has the image's model: none fetches weights
            fetched = {name: found for name in compose.services
                       if (found := topology.written(name, cache))}
    finally:
        if not args.keep:
            topology.remove()
    inside = summary(outcome.code, outcome.stdout, outcome.stderr)
    say(f"{args.service} exited {outcome.code} after {outcome.seconds:.0f}s; "
        f"services at the end: {outcome.exits}")
    if outcome.code != 0:
        tail = "\n  | ".join(outcome.stderr.splitlines()[-15:])
        return fail(f"service {args.service} exited {outcome.code}:\n  | {tail}")
    if fetched:
        return fail(f"services wrote to the model cache {cache} instead of using the image's "
                    f"model file: {fetched}")
    if cache:
        say(f"no container wrote to the model cache {cache}: the nodes read the image's "
            "model file, the orchestrator's offer fetched nothing")
    say(f"host: swactor {shlex.join(host_argv)}")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "swactor.cli", *host_argv],
                          capture_output=True, text=True, timeout=args.timeout, check=False)
    host = summary(done.returncode, done.stdout, done.stderr)
    say(f"host run exited {done.returncode} after {time.monotonic() - started:.0f}s")
    print(f"compose {args.service}: {inside.generated} tokens: {inside.text!r}")
    print(f"host swactor run:      {host.generated} tokens: {host.text!r}")
    if done.returncode != 0:
        return fail(f"host swactor run exited {done.returncode}: {done.stderr[-1500:]}")
    if (inside.text, inside.prompt_tokens, inside.generated) != (
            host.text, host.prompt_tokens, host.generated) or inside.generated is None:
        return fail("the compose run and the host run differ")
    say("PASSED: the replayed image runs the compose topology to the same tokens")
    return 0


def fail(text: str) -> int:
    print(f"FAILED: {text}", file=sys.stderr, flush=True)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bad = [item for item in args.build_arg if "=" not in item]
    if bad:
        print(f"python -m swactor.imagecheck: --build-arg {bad[0]!r}: expected NAME=VALUE",
              file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("python -m swactor.imagecheck: needs root (chroot, mounts, network "
              "namespaces); run it as root, e.g. `sudo just docker-check`", file=sys.stderr)
        return 2
    args.cache.mkdir(parents=True, exist_ok=True)
    sweep_stale_runs(args.cache, say)
    work = args.cache / f"run-{os.getpid()}"
    image: Image | None = None
    try:
        image = build(args, work)
        if args.what == "build":
            return 0
        return check(args, image, work)
    except StepFailed as error:
        return fail(str(error))
    except (ComposeError, RootfsError) as error:
        return fail(str(error))
    finally:
        if args.keep:
            say(f"kept {work}")
        elif work.exists():
            remove_tree(work)


if __name__ == "__main__":
    sys.exit(main())
