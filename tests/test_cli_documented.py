"""docs/cli.md documents every sub-command and flag, with the parser's own words."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from redline.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("cli_reference",
                                                  ROOT / "scripts" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_is_the_parsers() -> None:
    written = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert written == _generator().reference(build_parser()), (  # type: ignore[attr-defined]
        "docs/cli.md is out of date: run `python scripts/cli_reference.py`")


def test_every_flag_has_a_meaning_and_a_row_in_its_section() -> None:
    written = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert len(sub.choices) >= 6
    for name, command in sub.choices.items():
        section = written.split(f"## `redline {name}`", 1)[1].split("\n## ", 1)[0]
        for action in command._actions:
            if action.dest in ("help", "parser"):
                continue
            assert action.help, f"redline {name}: {action.option_strings or action.dest} " \
                                "has no help text"
            for flag in action.option_strings:
                assert f"`{flag}`" in section, f"redline {name} {flag} is not in docs/cli.md"


def test_every_command_prints_its_help() -> None:
    """argparse expands ``%`` in help texts: one unescaped percent sign (``5 %)``) makes
    ``--help`` raise instead of printing."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "usage:" in parser.format_help()
    for name, command in sub.choices.items():
        assert "usage:" in command.format_help(), name  # raised here before
