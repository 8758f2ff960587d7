"""Runs: what assembles a measured run from the layers below — a closed recorder measured,
diagnosed and made into its report (:func:`build_report`, in :mod:`redline.runs.build`), the
public :class:`~redline.runs.watch.Watch` (what ``redline.watch()`` returns: a recorder that
builds, prints and writes its report on exit), the exchange and merge of a job's ranks
(:mod:`redline.runs.ranks`) and the live Prometheus endpoint
(:mod:`redline.runs.metrics_server`).

``build_report`` is imported on first use: importing this package loads no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redline.runs.build import build_report

__all__ = ["build_report"]


def __getattr__(name: str) -> Any:
    if name == "build_report":
        from redline.runs.build import build_report

        return build_report
    raise AttributeError(f"module 'redline.runs' has no attribute {name!r}")
