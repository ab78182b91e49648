"""The commands the documentation shows still run: every ``seqzoo ...`` command in a code block or
inline code span of README.md and docs/*.md parses with today's CLI, and every ``seqzoo train
CONFIG --set ...`` resolves to a valid config (nothing is trained). A renamed flag, config key or
file then fails here instead of in a reader's terminal."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest
import torch

from seqzoo.cli import build_parser
from seqzoo.config import load_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SUBCOMMANDS = set(build_parser()._subparsers._group_actions[0].choices)  # train, evaluate, ...


def _code(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every fenced block's lines and inline code span, with a shell
    line continuation (``\\`` at the end of a line) joined to the next line."""
    found, fence = [], False
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        line, start = lines[number], number + 1
        number += 1
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        while fence and line.rstrip().endswith("\\") and number < len(lines):
            line, number = line.rstrip()[:-1] + " " + lines[number].strip(), number + 1
        found.extend([(start, line)] if fence else [(start, span) for span in re.findall(r"`([^`]+)`", line)])
    return found


def _commands() -> list[pytest.param]:
    """Each command as argv after ``seqzoo``. Left out: a bare ``seqzoo SUBCOMMAND`` naming a command
    in prose, and commands that take an argument from a shell variable set on an earlier line."""
    params = []
    for path in DOCS:
        for line, code in _code(path.read_text(encoding="utf-8")):
            for match in re.finditer(r"(?:^|[\s;&|(])seqzoo\s+(\S+)", code):
                if match.group(1) not in SUBCOMMANDS:
                    continue
                argv = shlex.split(code[match.start(1) :], comments=True)
                ends = [i for i, arg in enumerate(argv) if arg in ("&&", "||", ";", "|") or arg.startswith((">", "<"))]
                argv = argv[: ends[0]] if ends else argv  # the command, not what its output goes to
                named = len(argv) == 1 and argv[0] != "train"  # `seqzoo train` alone trains the default recipe
                if not named and not any(re.search(r"\$(?!SEQZOO_DATA)\w", arg) for arg in argv):
                    params.append(pytest.param(argv, id=f"{path.relative_to(ROOT)}:{line}"))
    return params


COMMANDS = _commands()


def test_the_documentation_shows_commands():
    assert len(COMMANDS) > 80  # the extraction itself works (README.md and docs/*.md had about 100)


@pytest.mark.parametrize("argv", COMMANDS)
def test_documented_command_parses_and_its_config_resolves(argv, monkeypatch, tmp_path):
    monkeypatch.setenv("SEQZOO_DATA", str(tmp_path))  # configs read their corpora from $SEQZOO_DATA
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # documented GPU commands parse here too
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    try:
        args = build_parser().parse_args(argv)
        if args.command == "bench":
            importlib.import_module(f"seqzoo.bench.{args.name}").build_parser().parse_args(args.rest)
    except SystemExit:
        pytest.fail(f"seqzoo {shlex.join(argv)}: the CLI refuses it (its message is above)")
    if args.command == "train" and not args.resume and (args.config is None or args.config.endswith(".yaml")):
        load_config(args.config and ROOT / args.config, args.set)
