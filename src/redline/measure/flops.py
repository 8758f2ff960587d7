"""FLOPs of one training step, counted once with ``torch.utils.flop_counter``.

MFU (PaLM, arXiv 2204.02311, Appendix B): model FLOPs per second ÷ the device's peak FLOP/s for
the dtype in use. FlopCounterMode counts matmuls, convolutions and SDPA (2·m·n·k per GEMM) for
forward and backward; it does not discount causal attention and counts no recompute
(``torch.utils.flop_counter``), which is the MFU (not HFU) convention.
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

    @property
    def active(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        try:
            mode = FlopCounterMode(display=False)
            mode.__enter__()
            self._mode = mode
        except Exception as e:  # counting is best-effort; say why it failed
            self.error = f"FlopCounterMode could not start: {type(e).__name__}: {e}"

    def stop(self) -> None:
        mode, self._mode = self._mode, None
        if mode is None:
            return
        try:
            mode.__exit__(None, None, None)
            self.flops = float(mode.get_total_flops())
            counts = mode.get_flop_counts().get("Global", {})
            self.conv_flops = float(sum(n for op, n in counts.items() if "convolution" in str(op)))
        except Exception as e:
            self.error = f"FlopCounterMode failed: {type(e).__name__}: {e}"
