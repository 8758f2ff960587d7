"""The ``redline`` command line (argument parsing and exit codes only); the entry point is
:func:`redline.cli.main.main`. Not imported here, so ``python -m redline.cli.main`` runs it
cleanly."""

__all__: list[str] = []
