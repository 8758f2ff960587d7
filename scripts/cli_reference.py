"""Write docs/cli.md, the command-line reference, from the parser itself (one source for the
flags, their meaning and defaults): ``python scripts/cli_reference.py``.
``tests/test_cli_documented.py`` fails when docs/cli.md is not what this writes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference(parser: argparse.ArgumentParser) -> str:
    """The markdown reference of every sub-command of ``parser``."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {a.dest: a.help or "" for a in sub._choices_actions}
    lines = ["# Command line", "",
             "Every sub-command of `redline` and each of its arguments, in the words of "
             "`redline CMD --help` (this page is written from the parser by "
             "`python scripts/cli_reference.py`; `tests/test_cli_documented.py` fails when it "
             "is out of date).", ""]
    for name, command in sub.choices.items():
        summary = summaries.get(name, "")
        lines += [f"## `redline {name}`", "", summary[:1].upper() + summary[1:] + ".", ""]
        if command.description:
            lines += [command.description, ""]
        lines += ["| argument | meaning |", "|---|---|"]
        for action in command._actions:
            if action.dest in ("help", "parser"):
                continue
            metavar = f" {action.metavar}" if action.metavar and action.nargs != 0 else ""
            names = (", ".join(f"`{o}`{metavar}" for o in action.option_strings)
                     if action.option_strings else f"`{action.metavar or action.dest}`")
            if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
                names += " (" + ", ".join(f"`{c}`" for c in action.choices) + ")"
            lines.append(f"| {names} | {_cell(action.help or '')} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    sys.path.insert(0, str(DOC.parents[1] / "src"))
    from redline.cli.main import build_parser

    DOC.write_text(reference(build_parser()), encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
