"""The stall check: one fetch that alone makes the data wait look like starvation.

The breakdown shows the time it cost; :func:`redline.diagnose.data.data_starvation` does not fire
on it (its robust share stays under the threshold); this note tells the user why.
"""

from __future__ import annotations

from redline.core.measurements import Measurements
from redline.diagnose.thresholds import DATA_WAIT_MIN_FRACTION


def stall_note(m: Measurements) -> str | None:
    """A note when one step's data wait alone crosses the data-starvation threshold, else
    None.

    Args:
        m: one run's measurements.

    Returns:
        The note (names the step and its wait in ms) when the data wait is above the
        data-starvation threshold with its slowest step and below it without; else None.
    """
    dw = m.share("data_wait")
    if (dw is None or dw.fraction_without_slowest is None or dw.slowest_step_s is None
            or dw.fraction < DATA_WAIT_MIN_FRACTION
            or dw.fraction_without_slowest >= DATA_WAIT_MIN_FRACTION):
        return None
    return (f"One fetch made most of the data wait: step {dw.slowest_step} waited "
            f"{dw.slowest_step_s * 1e3:,.1f} ms for its batch; without that step the loop waits "
            f"{dw.fraction_without_slowest:.1%} of the time, not {dw.fraction:.1%}. A stall "
            "(a GC pause, a preempted or cold read), not starvation: no data finding is raised "
            "on it; measure more steps if it recurs.")
