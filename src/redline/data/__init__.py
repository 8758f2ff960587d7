"""Data-path fixes: a device prefetcher (more to come: loader autotune, sample cache)."""

from redline.data.prefetcher import DevicePrefetcher, PrefetchStats, map_tensors

__all__ = ["DevicePrefetcher", "PrefetchStats", "map_tensors"]
