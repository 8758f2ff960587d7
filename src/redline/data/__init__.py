"""Data-path fixes: loader autotune, a device prefetcher, a cache of preprocessed samples and
JPEG decode on the device.

The names are imported lazily: the cache's writer process (:mod:`redline.data.cache_proc`)
imports the stores alone, without torch.
"""

from __future__ import annotations

from redline._lazy import lazy_attributes

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from redline.core.loader import LoaderSettings
    from redline.data.autotune import LoaderPlan, autotune_loader
    from redline.data.cache import CachedDataset
    from redline.data.cache_counts import CacheStats
    from redline.data.cache_split import CacheSplit
    from redline.data.device_decode import DeviceDecoder, JpegSplit
    from redline.data.prefetcher import DevicePrefetcher, PrefetchStats, map_tensors
    from redline.data.stores import LmdbStore, RedisStore

__all__ = [
    "CacheSplit",
    "CacheStats",
    "CachedDataset",
    "DeviceDecoder",
    "DevicePrefetcher",
    "JpegSplit",
    "LmdbStore",
    "LoaderPlan",
    "LoaderSettings",
    "PrefetchStats",
    "RedisStore",
    "autotune_loader",
    "map_tensors",
]

_LAZY = {
    "LoaderSettings": "redline.core.loader",
    "LoaderPlan": "redline.data.autotune",
    "autotune_loader": "redline.data.autotune",
    "CachedDataset": "redline.data.cache",
    "CacheStats": "redline.data.cache_counts",
    "CacheSplit": "redline.data.cache_split",
    "DeviceDecoder": "redline.data.device_decode",
    "JpegSplit": "redline.data.device_decode",
    "DevicePrefetcher": "redline.data.prefetcher",
    "PrefetchStats": "redline.data.prefetcher",
    "map_tensors": "redline.data.prefetcher",
    "LmdbStore": "redline.data.stores",
    "RedisStore": "redline.data.stores",
}


__getattr__ = lazy_attributes(__name__, _LAZY)
