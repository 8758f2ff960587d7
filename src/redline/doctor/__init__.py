"""``redline doctor``: an unmodified script run under a watch, and its report."""

from redline.doctor.runner import DoctorError, DoctorResult, run_doctor

__all__ = ["DoctorError", "DoctorResult", "run_doctor"]
