"""Data-path fixes: loader autotune and a device prefetcher (sample cache: to come)."""

from redline.data.autotune import LoaderPlan, LoaderSettings, autotune_loader
from redline.data.prefetcher import DevicePrefetcher, PrefetchStats, map_tensors

__all__ = ["DevicePrefetcher", "LoaderPlan", "LoaderSettings", "PrefetchStats", "autotune_loader",
           "map_tensors"]
