"""DataLoader settings: one definition, embedded wherever a loader's configuration is said —
what a watch saw, what the loader autotune tries, what a tuning plan applies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderSettings:
    """The knobs of a ``torch.utils.data.DataLoader`` that decide how batches are fetched."""

    num_workers: int = 0
    """Worker processes (0 = fetch in the training process)."""
    prefetch_factor: int | None = None
    """Batches in flight per worker (None with ``num_workers=0``; PyTorch's default is 2)."""
    pin_memory: bool = False
    """Collate into page-locked memory, so host→device copies can be asynchronous."""
    persistent_workers: bool = False
    """Keep the workers (and their copy of the dataset) alive across epochs."""

    def __post_init__(self) -> None:
        # type() is, not isinstance: a bool is an int, and True workers is a mistake
        if type(self.num_workers) is not int or self.num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0, got {self.num_workers!r}")
        if self.prefetch_factor is not None and (type(self.prefetch_factor) is not int
                                                 or self.prefetch_factor < 1):
            raise ValueError(f"prefetch_factor must be an int >= 1 or None, got "
                             f"{self.prefetch_factor!r}")
        for name in ("pin_memory", "persistent_workers"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")

    def loader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``DataLoader(...)`` (the worker-only ones only with workers,
        where PyTorch accepts them)."""
        kw: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kw["prefetch_factor"] = self.prefetch_factor or 2
            kw["persistent_workers"] = self.persistent_workers
        return kw

    @classmethod
    def of(cls, loader: Any) -> LoaderSettings:
        """The settings of an existing DataLoader."""
        nw = int(loader.num_workers)
        return cls(num_workers=nw, prefetch_factor=loader.prefetch_factor if nw > 0 else None,
                   pin_memory=bool(loader.pin_memory),
                   persistent_workers=bool(loader.persistent_workers))
