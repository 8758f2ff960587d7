"""Build step beyond pyproject.toml's metadata: the cache's per-sample hand-over in C
(``src/redline/data/_ring.c``). Optional: where no C compiler is there, the install goes on
and :mod:`redline.data.cache_ring` uses the same code in Python (``COMPILED`` says which)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("redline.data._ring", ["src/redline/data/_ring.c"],
                             optional=True)])
