"""Argument types shared by the sub-commands: each error names the flag and what it means."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping


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
