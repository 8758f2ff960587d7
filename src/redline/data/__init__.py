"""Data-path fixes: loader autotune, a device prefetcher, a cache of preprocessed samples and
JPEG decode on the device."""

from redline.core.loader import LoaderSettings
from redline.data.autotune import LoaderPlan, autotune_loader
from redline.data.cache import CachedDataset, CacheStats
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
