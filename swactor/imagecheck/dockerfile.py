"""Read a Dockerfile into the steps a build would take, without a Docker engine.

Theory of operation. `parse(text)` turns the file into `Instruction`s: comment lines
go, a line ending in a backslash continues on the next one (Docker joins the two
without the backslash and the newline, and drops comment lines inside the
continuation), the first word names the instruction, leading `--flag=value` words
are its flags, and a rest that parses as a JSON list of strings is the exec form.
Nothing is skipped: an instruction this module does not know, a parser directive
other than `escape=\\`, a heredoc, an unknown flag or a second `FROM` is a
`DockerfileError` naming the line and the instruction.

`expand(word, env)` is Docker's word processing for the instructions that take
variables (`ENV`, `ARG`, `WORKDIR`, `COPY`, `USER`, `FROM`, `VOLUME`, `EXPOSE`):
single and double quotes, backslash escapes, `$NAME`, `${NAME}`, `${NAME:-word}` and
`${NAME:+word}`; any other `${...}` form is refused. `RUN` is not expanded here: its
shell does that, with the build's variables in its environment.

`Stage` applies the instructions that change only the build's state (ARG scoping
before and after `FROM`, ENV, WORKDIR, USER, SHELL, ENTRYPOINT/CMD, EXPOSE, VOLUME,
LABEL); the replayer (`replay.py`) runs `RUN` and `COPY` against a root filesystem.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

# The PATH a Docker engine gives a container whose image sets none.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Instruction -> the flags it may carry (a flag this table does not list is refused).
KNOWN: dict[str, frozenset[str]] = {
    "FROM": frozenset({"platform"}),
    "ARG": frozenset(),
    "ENV": frozenset(),
    "WORKDIR": frozenset(),
    "COPY": frozenset({"chown"}),
    "RUN": frozenset(),
    "USER": frozenset(),
    "SHELL": frozenset(),
    "ENTRYPOINT": frozenset(),
    "CMD": frozenset(),
    "EXPOSE": frozenset(),
    "VOLUME": frozenset(),
    "LABEL": frozenset(),
}
_DIRECTIVE = re.compile(r"^#\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(.*?)\s*$")
_HEREDOC = re.compile(r"<<-?\s*[\"']?[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class DockerfileError(Exception):
    """The Dockerfile holds something this replayer does not understand (named)."""


@dataclass(frozen=True)
class Instruction:
    """One instruction: its first line number, keyword, flags and argument text."""

    line: int
    keyword: str
    flags: tuple[tuple[str, str], ...]
    rest: str
    exec_form: tuple[str, ...] | None

    @property
    def source(self) -> str:
        """The instruction as one line (continuations joined), for messages."""
        flags = "".join(f"--{name}={value} " for name, value in self.flags)
        return re.sub(r"\s+", " ", f"{self.keyword} {flags}{self.rest}").strip()

    def where(self) -> str:
        return f"line {self.line}: {self.source}"


def parse(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile (module doc); DockerfileError on what it refuses."""
    lines = text.splitlines()
    start = _directives(lines)
    instructions: list[Instruction] = []
    index = start
    while index < len(lines):
        raw = lines[index]
        if not raw.strip() or raw.lstrip().startswith("#"):
            index += 1
            continue
        first = index + 1
        parts: list[str] = []
        while True:
            line = lines[index]
            index += 1
            stripped = line.rstrip()
            if stripped.endswith("\\"):
                parts.append(stripped[:-1])
                while index < len(lines) and lines[index].lstrip().startswith("#"):
                    index += 1  # comment lines inside a continuation are dropped
                if index < len(lines):
                    continue
            else:
                parts.append(line)
            break
        instructions.append(_instruction(first, "".join(parts)))
    froms = [i for i in instructions if i.keyword == "FROM"]
    if len(froms) != 1:
        where = froms[1].where() if froms else "line 1"
        raise DockerfileError(f"{where}: expected exactly one FROM, found {len(froms)} "
                              "(multi-stage builds are not replayed)")
    return instructions


def _directives(lines: list[str]) -> int:
    """Check the parser directives at the top; the index of the first line after them."""
    for index, line in enumerate(lines):
        match = _DIRECTIVE.match(line)
        if match is None:
            return index
        name, value = match.group(1).lower(), match.group(2)
        if name != "escape" or value != "\\":
            raise DockerfileError(f"line {index + 1}: parser directive `{name}={value}` "
                                  "is not replayed")
    return len(lines)


def _instruction(line: int, text: str) -> Instruction:
    keyword, _, rest = text.strip().partition(" ")
    keyword = keyword.upper()
    rest = rest.strip()
    where = f"line {line}: {keyword}"
    if keyword not in KNOWN:
        raise DockerfileError(f"{where}: instruction `{keyword}` is not replayed "
                              f"(known: {', '.join(sorted(KNOWN))})")
    flags: list[tuple[str, str]] = []
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        rest = rest.strip()
        name, eq, value = word[2:].partition("=")
        if name not in KNOWN[keyword] or not eq:
            raise DockerfileError(f"{where}: flag `{word}` is not replayed")
        flags.append((name, value))
    if keyword in ("RUN", "COPY") and _HEREDOC.search(rest):
        raise DockerfileError(f"{where}: heredocs are not replayed")
    exec_form: tuple[str, ...] | None = None
    if rest.startswith("["):
        try:
            parsed: object = json.loads(rest)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(v, str) for v in parsed):
            exec_form = tuple(parsed)
    return Instruction(line, keyword, tuple(flags), rest, exec_form)


# -- word processing -------------------------------------------------------------------


def words(text: str, env: Mapping[str, str]) -> list[str]:
    """Split `text` into words as Docker does (quotes group, whitespace splits), each
    expanded against `env`."""
    return [word for word, _ in _lex(text, env, split=True)]


def expand(text: str, env: Mapping[str, str]) -> str:
    """`text` with quotes removed and variables expanded (no word splitting)."""
    return "".join(word for word, _ in _lex(text, env, split=False))


def _lex(text: str, env: Mapping[str, str], split: bool) -> Iterator[tuple[str, bool]]:
    out: list[str] = []
    started = False
    i = 0
    quote = ""
    while i < len(text):
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = ""
            else:
                out.append(c)
            i += 1
            continue
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if quote == '"' and nxt not in '"$\\':
                out.append(c)
            out.append(nxt)
            started = True
            i += 2
            continue
        if c in "'\"" and not quote:
            quote = c
            started = True
            i += 1
            continue
        if c == '"' and quote == '"':
            quote = ""
            i += 1
            continue
        if c == "$":
            value, i = _variable(text, i, env)
            out.append(value)
            started = True
            continue
        if split and not quote and c.isspace():
            if started:
                yield "".join(out), True
                out, started = [], False
            i += 1
            continue
        out.append(c)
        started = True
        i += 1
    if quote:
        raise DockerfileError(f"unterminated {quote} quote in {text!r}")
    if started or not split:
        yield "".join(out), True


def _variable(text: str, i: int, env: Mapping[str, str]) -> tuple[str, int]:
    """Expand the variable at text[i] == '$'; (value, index after it)."""
    if text.startswith("${", i):
        end = _closing_brace(text, i + 2)
        body = text[i + 2:end]
        match = _NAME.match(body)
        if match is None:
            raise DockerfileError(f"cannot expand ${{{body}}} in {text!r}")
        name, tail = match.group(0), body[match.end():]
        value = env.get(name, "")
        if not tail:
            return value, end + 1
        if tail.startswith(":-"):
            return (value if value else expand(tail[2:], env)), end + 1
        if tail.startswith(":+"):
            return (expand(tail[2:], env) if value else ""), end + 1
        raise DockerfileError(f"variable form ${{{body}}} is not replayed (in {text!r})")
    match = _NAME.match(text, i + 1)
    if match is None:
        return "$", i + 1
    return env.get(match.group(0), ""), match.end()


def _closing_brace(text: str, start: int) -> int:
    depth = 1
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise DockerfileError(f"unterminated ${{ in {text!r}")


# -- build state -----------------------------------------------------------------------


@dataclass
class Stage:
    """The build state the non-filesystem instructions change (module doc)."""

    build_args: Mapping[str, str] = field(default_factory=dict)
    base: str | None = None
    env: dict[str, str] = field(default_factory=lambda: {"PATH": DEFAULT_PATH})
    args: dict[str, str] = field(default_factory=dict)
    global_args: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = "root"
    shell: tuple[str, ...] = ("/bin/sh", "-c")
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    exposed: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    used_build_args: set[str] = field(default_factory=set)

    def scope(self) -> dict[str, str]:
        """Variables an instruction may expand: ARGs in scope, then ENV over them."""
        if self.base is None:
            return dict(self.global_args)
        return {**self.args, **self.env}

    def run_env(self) -> dict[str, str]:
        """The environment of a RUN: the ARGs in scope and the ENV (ENV wins)."""
        return {**self.args, **self.env}

    def apply(self, ins: Instruction) -> bool:
        """Apply a state-only instruction; False for RUN and COPY (the replayer's)."""
        if ins.keyword in ("RUN", "COPY"):
            if self.base is None:
                raise DockerfileError(f"{ins.where()}: before FROM")
            return False
        if ins.keyword != "ARG" and ins.keyword != "FROM" and self.base is None:
            raise DockerfileError(f"{ins.where()}: before FROM")
        getattr(self, f"_{ins.keyword.lower()}")(ins)
        return True

    def _arg(self, ins: Instruction) -> None:
        scope = self.scope()
        for word in _split_raw(ins.rest):
            name, eq, default = word.partition("=")
            if not _NAME.fullmatch(name):
                raise DockerfileError(f"{ins.where()}: bad ARG name {name!r}")
            if name in self.build_args:
                value: str | None = self.build_args[name]
                self.used_build_args.add(name)
            elif eq:
                value = expand(default, scope)
            elif self.base is not None and name in self.global_args:
                value = self.global_args[name]
            else:
                value = None  # declared without a value: unset, as in Docker
            target = self.global_args if self.base is None else self.args
            if value is not None:
                target[name] = value

    def _from(self, ins: Instruction) -> None:
        parts = words(ins.rest, self.global_args)
        if len(parts) == 3 and parts[1].upper() == "AS":
            parts = parts[:1]
        if len(parts) != 1:
            raise DockerfileError(f"{ins.where()}: expected FROM IMAGE [AS NAME]")
        self.base = parts[0]

    def _env(self, ins: Instruction) -> None:
        scope = self.scope()
        pairs = _split_raw(ins.rest)
        if pairs and "=" not in pairs[0]:  # legacy `ENV NAME value with spaces`
            name, _, value = ins.rest.partition(" ")
            self.env[name] = expand(value.strip(), scope)
            return
        for pair in pairs:
            name, eq, value = pair.partition("=")
            if not eq or not _NAME.fullmatch(name):
                raise DockerfileError(f"{ins.where()}: expected NAME=VALUE, got {pair!r}")
            self.env[name] = expand(value, scope)

    def _workdir(self, ins: Instruction) -> None:
        path = expand(ins.rest, self.scope())
        self.workdir = posixpath.normpath(posixpath.join(self.workdir, path))

    def _user(self, ins: Instruction) -> None:
        self.user = expand(ins.rest, self.scope())

    def _shell(self, ins: Instruction) -> None:
        if ins.exec_form is None or not ins.exec_form:
            raise DockerfileError(f"{ins.where()}: SHELL takes a JSON list")
        self.shell = ins.exec_form

    def _command(self, ins: Instruction) -> tuple[str, ...]:
        if ins.exec_form is not None:
            return ins.exec_form
        return (*self.shell, ins.rest)

    def _entrypoint(self, ins: Instruction) -> None:
        self.entrypoint = self._command(ins)

    def _cmd(self, ins: Instruction) -> None:
        self.cmd = self._command(ins)

    def _expose(self, ins: Instruction) -> None:
        self.exposed.extend(words(ins.rest, self.scope()))

    def _volume(self, ins: Instruction) -> None:
        paths = ins.exec_form if ins.exec_form is not None else tuple(
            words(ins.rest, self.scope()))
        self.volumes.extend(expand(path, self.scope()) for path in paths)

    def _label(self, ins: Instruction) -> None:
        for pair in words(ins.rest, self.scope()):
            name, eq, value = pair.partition("=")
            if not eq:
                raise DockerfileError(f"{ins.where()}: expected KEY=VALUE, got {pair!r}")
            self.labels[name] = value


def _split_raw(text: str) -> list[str]:
    """Split on unquoted whitespace, keeping quotes and `$` for a later `expand`."""
    out: list[str] = []
    current: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c.isspace():
            if current:
                out.append("".join(current))
                current = []
            i += 1
            continue
        current.append(c)
        i += 1
    if quote:
        raise DockerfileError(f"unterminated {quote} quote in {text!r}")
    if current:
        out.append("".join(current))
    return out
