"""Errors of the framework integrations."""

from __future__ import annotations

import sys

from redline.core.errors import RedlineError


class MissingFrameworkError(RedlineError, ImportError):
    """An integration was imported without its framework installed."""


class IntegrationError(RedlineError, ValueError):
    """A callback or an adapter given something it cannot use; the message says what."""


def missing(framework: str, module: str, extra: str) -> MissingFrameworkError:
    """The error for an integration whose framework is not installed, with the install hint."""
    return MissingFrameworkError(
        f"redline.integrations.{extra} needs {framework}, and the module {module!r} is not "
        f"installed for {sys.executable}; install it with: pip install 'redline[{extra}]'")
