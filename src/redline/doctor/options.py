"""What ``redline doctor`` is asked to do: one typed record, one default per option.

The command line builds a :class:`DoctorOptions` from its flags (each flag's ``dest`` is a field
name, and its default is read from here); under a launcher the record travels to every rank as
one JSON document (:meth:`DoctorOptions.to_json`), not as flags spelled again. Messages name the
fields in backticks (`` `steps` ``), which the command line shows as its flags.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from redline.core.errors import RedlineError
from redline.measure.config import WatchConfig

_WATCH = WatchConfig()


class DoctorError(RedlineError):
    """A usage error: nothing was run. The message says what was received and what to do."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DoctorOptions:
    """How one ``redline doctor`` run measures and where it writes (validated when built)."""

    steps: int = 50
    """Measured steps after warm-up, then the run stops (≥ 1)."""
    warmup: int = _WATCH.warmup_steps
    """Steps left out of the statistics at the start (≥ 0)."""
    json_path: str | None = None
    """Where the report is also written as JSON; None = not written."""
    count_flops: bool = True
    """Count one step's FLOPs for MFU (that step is left out of the timing statistics);
    False = MFU unknown."""
    trace_dir: str | None = None
    """Also record a short torch.profiler trace into this folder, analyse it and add its
    findings; None = no trace."""
    tune_loader: bool = False
    """When the loop starves for data, time DataLoader settings in it (rebuilding the user's
    loader) and put the measured best in the fix."""
    metrics_port: int | None = None
    """Serve live Prometheus metrics on this TCP port (each rank: port + LOCAL_RANK; 0 = any
    free port); None = no endpoint."""
    metrics_address: str = _WATCH.metrics_address
    """Address the metrics endpoint binds to."""
    timeline_path: str | None = None
    """Also write the steps and sampled counters as a Chrome-trace JSON for Perfetto here."""
    html_path: str | None = None
    """Also write a self-contained HTML report here."""
    live: bool = False
    """Show a live panel on stderr while the script runs (a terminal only)."""
    device: str | None = None
    """Device the job trains on ('cuda', 'cuda:1', 'cpu'); None = CUDA if available."""

    def __post_init__(self) -> None:
        for name, low in (("steps", 1), ("warmup", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise DoctorError(f"`{name}` must be an integer >= {low}, got {value!r}")
        port = self.metrics_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 0 <= port <= 65535):
            raise DoctorError(f"`metrics_port` must be a TCP port 0..65535 (0 = any free one), "
                              f"got {port!r}")

    def outputs(self) -> dict[str, str | None]:
        """The files the run writes, by field name."""
        return {"json_path": self.json_path, "timeline_path": self.timeline_path,
                "html_path": self.html_path}

    def to_json(self) -> str:
        """The record as one JSON document, for the ranks of a launcher's job."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DoctorOptions:
        """The record :meth:`to_json` wrote; unknown fields are refused.

        Raises:
            DoctorError: ``text`` is not such a document.
        """
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as e:
            raise DoctorError(f"doctor's options for a rank are not JSON ({e}); got "
                              f"{text[:80]!r}") from None
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or not set(data) <= names:
            extra = sorted(set(data) - names) if isinstance(data, dict) else type(data).__name__
            raise DoctorError(f"doctor's options for a rank hold {extra!r}, expected only "
                              f"{sorted(names)}: the rank runs another redline version than "
                              "the launcher; install one version for both")
        return cls(**data)

    def watch_config(self) -> WatchConfig:
        """The watch's settings for this run."""
        return WatchConfig(warmup_steps=self.warmup, max_steps=self.steps,
                           count_flops=self.count_flops, device=self.device,
                           trace_dir=self.trace_dir, keep_loaders=self.tune_loader,
                           metrics_port=self.metrics_port, metrics_address=self.metrics_address,
                           timeline_path=self.timeline_path)
