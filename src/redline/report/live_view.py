"""A live panel on the terminal while the script runs (``redline doctor --live``).

It is drawn on stderr, at most twice a second, by rich's ``Live`` display on its own thread: the
script's prints (stdout and stderr) are written above the panel, whole lines at a time, and the
panel is erased when the script ends, fails or is interrupted (``transient``). Each redraw reads
the watch's step records (:func:`redline.measure.live.live_snapshot`): nothing is added to the
training loop's steps. Where stderr is not a terminal there is no panel (it would only fill a
log with redraws).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from redline.diagnose.thresholds import DATA_WAIT_MIN_FRACTION
from redline.measure.live import LiveSnapshot, live_snapshot
from redline.report.terminal import bar

if TYPE_CHECKING:
    from redline.measure.recorder import Recorder

REFRESH_PER_S = 2.0
"""Redraws per second at most."""

WINDOW_STEPS = 50
"""Measured steps the panel's values are over (the most recent ones)."""

BAR_WIDTH = 20


def leading_issue(snap: LiveSnapshot) -> str | None:
    """The largest removable share so far, by the same measure and threshold as the report's
    findings (docs/report.md, "The catalogue"); None when nothing stands out yet."""
    if snap.data_wait_fraction >= DATA_WAIT_MIN_FRACTION:
        return (f"data_starvation: the loop waits {snap.data_wait_fraction:.0%} of each step "
                "for its next batch")
    copy = snap.phase_fractions.get("h2d_copy", 0.0)
    if copy >= DATA_WAIT_MIN_FRACTION:
        return f"host→device copies take {copy:.0%} of each step"
    return None


def render(w: Recorder, window_steps: int = WINDOW_STEPS) -> Group:
    """The panel for the watch's current state."""
    snap = live_snapshot(w, window_steps)
    head = Text("redline live · ", style="bold")
    if snap is None:
        head.append(f"warm-up: {w.tracker.closed} step(s) so far, nothing measured yet")
        return Group(head)
    head.append(f"step {snap.steps_total} ({snap.steps_measured} measured) · "
                f"{snap.step_time_mean_s * 1e3:.1f} ms/step")
    if snap.samples_per_s is not None:
        head.append(f" · {snap.samples_per_s:,.0f} samples/s")
    extra = []
    if snap.device_busy_fraction is not None:
        extra.append(f"device busy ≤ {snap.device_busy_fraction:.0%}")
    if snap.mfu is not None:
        extra.append(f"MFU {snap.mfu:.1%}")
    if extra:
        head.append(" · " + " · ".join(extra))
    lines: list[Text] = [head]
    shown = [(phase_name, fraction) for phase_name, fraction in snap.phase_fractions.items()
             if fraction >= 0.005]
    for phase, frac in sorted(shown, key=lambda pf: -pf[1]):
        style = "red" if phase == "data_wait" and frac >= DATA_WAIT_MIN_FRACTION else ""
        lines.append(Text(f"  {phase:<10} {bar(frac, BAR_WIDTH)} {frac:>4.0%}", style=style))
    issue = leading_issue(snap)
    lines.append(Text(f"  so far: {issue}" if issue else "  so far: no finding stands out",
                      style="yellow" if issue else "green"))
    lines.append(Text(f"  (last {snap.window_steps} measured steps)", style="dim"))
    return Group(*lines)


@contextlib.contextmanager
def live_panel(w: Recorder, enabled: bool = True) -> Iterator[bool]:
    """Show the panel while the block runs; yields whether it is shown."""
    console = Console(file=sys.stderr)
    if not enabled or not console.is_terminal:
        yield False
        return
    with Live(get_renderable=lambda: render(w), console=console,
              refresh_per_second=REFRESH_PER_S, transient=True, redirect_stdout=True,
              redirect_stderr=True):
        yield True
