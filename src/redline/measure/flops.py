"""FLOPs of one training step, counted once with ``torch.utils.flop_counter``.

MFU (PaLM, arXiv 2204.02311, Appendix B): model FLOPs per second ÷ the device's peak FLOP/s for
the dtype in use. FlopCounterMode counts matmuls, convolutions and SDPA (2·m·n·k per GEMM) for
forward and backward; it does not discount causal attention and counts no recompute
(``torch.utils.flop_counter``), which is the MFU (not HFU) convention.

The counter is a dispatch mode: every operator call passes through Python, so a step of many
small calls (a loop of ``LSTMCell`` steps) runs many times slower while counted. The count
therefore covers one forward+backward (from the step's start to the end of its first outermost
backward) and is scaled by the backward passes the step made: an LBFGS step's closures or the
micro-batches of gradient accumulation are counted once, not each time. The optimizer's own
work is not model FLOPs and is not counted.
"""

from __future__ import annotations

from torch.utils.flop_counter import FlopCounterMode


class FlopWindow:
    """Counts FLOPs between :meth:`start` and :meth:`stop` (one step), on the calling thread.

    The dispatch mode is entered and left at step boundaries (inside optimizer hooks), so it
    brackets exactly one step; that step is slowed and is excluded from timing statistics.
    """

    def __init__(self) -> None:
        self._mode: FlopCounterMode | None = None
        self.flops: float | None = None
        self.conv_flops: float | None = None
        """The part of ``flops`` in convolutions (forward and backward): cuDNN runs fp32
        convolutions in TF32 by default while fp32 matmuls stay fp32, so MFU needs both."""
        self.error: str | None = None
        self.passes: int | None = None
        """Backward passes of the counted step that ``flops`` was scaled to (the count covered
        the first one); None while nothing is counted or when no backward ended the slice."""
        self._slice: tuple[float, float] | None = None
        """(FLOPs, convolution FLOPs) of the slice, once its first backward ended."""

    @property
    def active(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        self._slice = None
        try:
            mode = FlopCounterMode(display=False)
            mode.__enter__()
            self._mode = mode
        except Exception as e:  # counting is best-effort; say why it failed
            self.error = f"FlopCounterMode could not start: {type(e).__name__}: {e}"

    def backward_ended(self) -> None:
        """The step's first outermost backward returned (on the training thread): stop
        counting; :meth:`stop` scales the slice to the step's backward passes."""
        mode, self._mode = self._mode, None
        if mode is not None:
            self._slice = self._exit(mode)

    def stop(self, passes: int = 1) -> None:
        """End of the counted step, which made ``passes`` outermost backwards: its FLOPs are
        the slice's × ``passes`` where a backward ended the slice, else all it counted."""
        mode, self._mode = self._mode, None
        if mode is not None:
            counted = self._exit(mode)
            if counted is not None:
                self.flops, self.conv_flops = counted
        elif self._slice is not None:
            n = max(1, passes)
            self.flops, self.conv_flops = self._slice[0] * n, self._slice[1] * n
            self.passes = n
        self._slice = None

    def _exit(self, mode: FlopCounterMode) -> tuple[float, float] | None:
        try:
            mode.__exit__(None, None, None)
            counts = mode.get_flop_counts().get("Global", {})
            return (float(mode.get_total_flops()),
                    float(sum(n for op, n in counts.items() if "convolution" in str(op))))
        except Exception as e:
            self.error = f"FlopCounterMode failed: {type(e).__name__}: {e}"
            return None
