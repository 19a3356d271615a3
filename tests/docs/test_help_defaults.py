"""Every default a command's `--help` names is the value the command really uses.

A help text that says "(default N)" (or "...; default N") is read for each flag of
`swactor serve`, `run`, `orchestrator`, `node` and `plan`, and N is compared with what
parsing no flags gives: the flag's argparse default, or, where that default is None
because the value is computed later, the product function that computes it
(`COMPUTED`). A help that names a
plain value for a computed default, without such a function here, fails: a computed
default must say how it is computed (as `--warm-batch-rows` does), not name one value.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterator

import pytest

from swactor.cli import build_parser
from swactor.cliargs import byte_count
from swactor.orchestrator.orchestrate_cmd import prompt_text
from swactor.serve.serve_cmd import warm_batch_rows

ARGV: dict[str, list[str]] = {
    "serve": [],
    "run": [],
    "orchestrator": ["--key", "k"],
    "node": ["--key", "k"],
    "plan": [],
}
"""The commands checked, with the least argv each parses with."""

COMPUTED: dict[tuple[str, str], Callable[[argparse.Namespace], object]] = {
    ("run", "prompt"): prompt_text,
    ("orchestrator", "prompt"): prompt_text,
}
"""Flags whose argparse default is None and whose help names the computed value."""

NAMED = re.compile(r"(?:\(|; )default:? (?P<value>'[^']*'|[\w.]+)(?=[;,:)\s])")
NUMBER = re.compile(r"\d+(\.\d+)?")
BYTES = re.compile(r"\d+[KMGT]i?B")


def named_defaults() -> Iterator[tuple[str, argparse.Action, str]]:
    """(command, action, the value its help names as its default) for every flag whose
    help names one value (not a rule such as "min(context, 2048)")."""
    for command in ARGV:
        parser = _subparser(command)
        for action in parser._actions:
            if not action.option_strings or not action.help:
                continue
            for match in NAMED.finditer(action.help):
                value = match.group("value")
                quoted = value.startswith("'")
                literal = (quoted or NUMBER.fullmatch(value) or BYTES.fullmatch(value)
                           or value.count(".") == 3  # an IPv4 address
                           or (action.choices is not None and value in action.choices))
                if literal:
                    yield command, action, value


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(command)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[command]
            return found
    raise AssertionError(f"no subcommand {command}")


def effective(command: str, action: argparse.Action) -> object:
    args = build_parser(command).parse_args([command, *ARGV[command]])
    resolve = COMPUTED.get((command, action.dest))
    if resolve is not None:
        return resolve(args)
    value = getattr(args, action.dest)
    assert value is not None, (
        f"swactor {command} {action.option_strings[0]}: the help names a default but "
        "the flag's default is computed elsewhere; say how it is computed")
    return value


def same(named: str, value: object) -> bool:
    if named.startswith("'"):
        return named[1:-1] == value
    if BYTES.fullmatch(named):
        actual = value if isinstance(value, int) else byte_count(str(value))
        return byte_count(named) == actual
    if NUMBER.fullmatch(named):
        return isinstance(value, int | float) and float(named) == float(value)
    return named == str(value)


CASES = list(named_defaults())


@pytest.mark.parametrize(("command", "action", "named"), CASES,
                         ids=[f"{c}{a.option_strings[0]}" for c, a, _ in CASES])
def test_each_named_default_is_the_value_used(command: str, action: argparse.Action,
                                              named: str) -> None:
    value = effective(command, action)
    assert same(named, value), (
        f"swactor {command} {action.option_strings[0]}: help says default {named}, "
        f"it is {value!r}")


def test_the_check_reads_the_defaults_of_every_command() -> None:
    """The check has something to check in each command (a regex that matched nothing
    would pass every help text)."""
    assert {command for command, _, _ in CASES} == set(ARGV)
    assert ("serve", "--slots") in {(c, a.option_strings[0]) for c, a, _ in CASES}


def test_warm_batch_rows_help_says_how_its_default_is_computed() -> None:
    """`--warm-batch-rows` defaults to the smaller of `--batch-rows` and 4 (none with
    one row per object): its help names that rule, not one number."""
    parser = build_parser("serve")
    args = parser.parse_args(["serve"])
    assert args.batch_rows == 4 and warm_batch_rows(args) == 4
    assert warm_batch_rows(parser.parse_args(["serve", "--batch-rows", "1"])) == 0
    action = next(a for a in _subparser("serve")._actions if a.dest == "warm_batch_rows")
    text = " ".join((action.help or "").split())
    assert "smaller of --batch-rows and 4" in text
    assert "none with --batch-rows 1" in text
    assert not NAMED.search(text) or all(
        not NUMBER.fullmatch(m.group("value")) for m in NAMED.finditer(text))
