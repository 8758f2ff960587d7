"""Argument types shared by the sub-commands: each error names the flag and what it means."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Mapping

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from typing import Any


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, at the width argparse gives it, found without importing shutil:
    argparse imports it for ``shutil.get_terminal_size`` in every formatter, made on each
    ``add_argument``, and it brings bz2, lzma and fnmatch along (~2 ms of ``redline trace``'s
    start-up)."""

    def __init__(self, prog: str, **options: Any) -> None:
        if options.get("width") is None:
            options["width"] = terminal_columns() - 2  # argparse's margin
        super().__init__(prog, **options)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with :class:`HelpFormatter` as its default; a sub-command's parser is
    of its parent's class, so of this one too."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("formatter_class", HelpFormatter)
        super().__init__(**options)


def terminal_columns(fallback: int = 80) -> int:
    """``shutil.get_terminal_size().columns``: ``COLUMNS`` when a positive integer, else the
    width of the terminal on ``sys.__stdout__``, else ``fallback``."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    stdout = sys.__stdout__
    try:  # None when Python runs without a stdout: the AttributeError shutil catches
        return os.get_terminal_size(stdout.fileno()).columns or fallback  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return fallback


def int_at_least(flag: str, minimum: int, meaning: str) -> Callable[[str], int]:
    """An argparse type: an integer ≥ ``minimum``; the error names the flag and its meaning."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{flag} must be >= {minimum} ({meaning}), got {v}")
        return v

    return parse


def port(flag: str) -> Callable[[str], int]:
    """An argparse type: a TCP port, 0..65535 (0 = any free port), checked before anything
    runs."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer, got {text!r}") from None
        if not 0 <= v <= 65535:
            raise argparse.ArgumentTypeError(
                f"{flag} must be 0..65535 (a TCP port; 0 = any free one), got {v}")
        return v

    return parse


def non_negative_float(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number, got {text!r}") from None
        if not v >= 0:
            raise argparse.ArgumentTypeError(f"{flag} must be >= 0, got {text}")
        return v

    return parse


def positive_float(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number, got {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{flag} must be a finite number > 0, got {text}")
        if not v > 0:
            raise argparse.ArgumentTypeError(f"{flag} must be > 0, got {text}")
        return v

    return parse


def count(flag: str) -> Callable[[str], int]:
    """An integer ≥ 1, also written 7.5e9 or 7.5B / 70M (parameter counts)."""
    def parse(text: str) -> int:
        t = text.strip().upper()
        mult = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}.get(t[-1:], 1.0)
        try:
            v = float(t[:-1] if mult != 1.0 else t) * mult
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number (e.g. 7e9, 7B), got "
                                             f"{text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{flag} must be a finite number (e.g. 7e9, 7B), "
                                             f"got {text}")
        if v < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be >= 1, got {text}")
        return round(v)

    return parse


def dest_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """A sub-command's field names (each option's ``dest``) → the flag that sets it."""
    return {a.dest: a.option_strings[0] for a in parser._actions
            if a.option_strings and a.dest != "help"}


def flag_words(message: str, flags: Mapping[str, str], *, keep_unknown: bool = False) -> str:
    """A library message, which names fields in backquotes (`` `steps` ``), with each field
    shown as the command's flag. A field without a flag loses only its backquotes, or with
    ``keep_unknown`` keeps them: for messages that also quote code (an `` `if` ``)."""
    return re.sub(r"`([a-z_]+)`",
                  lambda m: flags.get(m[1], m[0] if keep_unknown else m[1]), message)
