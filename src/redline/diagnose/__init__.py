"""Findings (design §4) from measurements."""

from redline.diagnose.engine import diagnose, rank
from redline.diagnose.finding import CATALOGUE, ceiling_speedup

__all__ = ["CATALOGUE", "ceiling_speedup", "diagnose", "rank"]
