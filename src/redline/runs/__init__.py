"""Runs: what assembles a measured run from the layers below — the public
:class:`~redline.runs.watch.Watch` (what ``redline.watch()`` returns: a recorder that builds,
prints and writes its report on exit), the exchange and merge of a job's ranks
(:mod:`redline.runs.ranks`) and the live Prometheus endpoint
(:mod:`redline.runs.metrics_server`)."""

__all__: list[str] = []
