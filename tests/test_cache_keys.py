"""The sample cache's keys follow the content and the code: helpers in the user's modules
called by module name, class attributes, environment variables, every item of the dataset;
the same under every PYTHONHASHSEED; fingerprinting a large array costs bounded memory."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from redline.data import CachedDataset
from redline.data.fingerprint import transform_fingerprint

SRC = os.environ.get("RL_SRC", str(Path(__file__).resolve().parents[1] / "src"))


def _module(src: str, name: str = "user_transform") -> dict[str, Any]:
    """Define ``src`` as a module of the user's would be (its own file name and globals)."""
    ns: dict[str, Any] = {"__name__": name}
    exec(compile(src, f"{name}.py", "exec"), ns)
    return ns


def _fp(fn: Any) -> str:
    return transform_fingerprint(fn)[0]


def _dfp(dataset: Any) -> str:
    """The dataset's part of the key (the store is never opened)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CachedDataset(dataset, _same, store="/nonexistent").fingerprint.split("-")[0]


def _same(x: Any) -> Any:
    return x


def _import(tmp_path: Path, name: str, src: str) -> Any:
    """Write ``src`` as the user's module ``name`` and import it (again, if it was)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(src))
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.invalidate_caches()
        if name in sys.modules:
            del sys.modules[name]
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


def test_a_helper_called_through_its_module_is_followed(tmp_path: Path) -> None:
    src = """
        SCALE = 2
        def helper(x):
            return x * SCALE
        """
    mod = _import(tmp_path, "rl_user_helpers", src)
    t = _module("def t(x):\n    return mymodule.helper(x) + mymodule.OFFSET\n")["t"]
    t.__globals__["mymodule"] = mod
    mod.OFFSET = 1
    before = _fp(t)
    assert _fp(t) == before  # nothing changed: the same key
    t.__globals__["mymodule"] = _import(tmp_path, "rl_user_helpers", src.replace("x * SCALE",
                                                                                   "x + SCALE"))
    t.__globals__["mymodule"].OFFSET = 1
    body_changed = _fp(t)
    assert body_changed != before  # the helper's body
    t.__globals__["mymodule"].SCALE = 3
    assert _fp(t) != body_changed  # the helper's module constant
    t.__globals__["mymodule"].SCALE = 2
    assert _fp(t) == body_changed
    t.__globals__["mymodule"].OFFSET = 5
    assert _fp(t) != body_changed  # a constant read through the module name


def test_class_attributes_read_by_the_transform_are_in_the_key() -> None:
    src = ("class Cfg:\n    SCALE = 2\n"
           "def t(x):\n    return x * Cfg.SCALE\n"
           "class Norm:\n    MEAN = (0.5, 0.5)\n"
           "    def __call__(self, x):\n        return x - self.MEAN[0]\n")
    m = _module(src)
    a, obj = _fp(m["t"]), _fp(m["Norm"]())
    m["Cfg"].SCALE = 3
    m["Norm"].MEAN = (0.4, 0.5)
    assert _fp(m["t"]) != a and _fp(m["Norm"]()) != obj
    m["Cfg"].SCALE = 2
    assert _fp(m["t"]) == a


def test_environment_variables_read_by_name_are_keyed_by_value(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    m = _module("import os\n"
                "def t(x):\n    return x * float(os.environ['RL_TEST_GAIN'])\n"
                "def g(x):\n    return x + float(os.getenv('RL_TEST_BIAS', '0'))\n"
                "def computed(x):\n    return x + len(os.environ[x])\n")
    monkeypatch.setenv("RL_TEST_GAIN", "2")
    monkeypatch.delenv("RL_TEST_BIAS", raising=False)
    a, b = transform_fingerprint(m["t"]), transform_fingerprint(m["g"])
    assert any("'RL_TEST_GAIN'" in u for u in a[1]) and any("'RL_TEST_BIAS'" in u for u in b[1])
    monkeypatch.setenv("RL_TEST_GAIN", "3")
    monkeypatch.setenv("RL_TEST_BIAS", "1")
    assert _fp(m["t"]) != a[0] and _fp(m["g"]) != b[0]
    monkeypatch.setenv("RL_TEST_OTHER", "x")  # a variable the transform does not read
    assert _fp(m["t"]) == _fp(m["t"])
    _, unseen = transform_fingerprint(m["computed"])
    assert any("environment read by computed" in u for u in unseen)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        CachedDataset(Numbers(4), m["t"], store=tmp_path / "c")
    (w,) = [w for w in said if "redline cache" in str(w.message)]
    assert "'RL_TEST_GAIN'" in str(w.message)  # once, naming it


class Numbers(Dataset[torch.Tensor]):
    def __init__(self, n: int = 64) -> None:
        self.n = n
        self.labels = list(range(n))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), float(self.labels[i]))


def double(x: Any) -> Any:
    return x * 2


def test_a_change_in_the_middle_of_the_dataset_changes_the_key(tmp_path: Path) -> None:
    x, y = torch.randn(10_000, 4), torch.arange(10_000)
    a = _dfp(TensorDataset(x, y))
    y2 = y.clone()
    y2[5_000] = 7  # one label in the middle
    assert _dfp(TensorDataset(x, y2)) != a
    assert _dfp(TensorDataset(x.clone(), y.clone())) == a  # content, not id
    ds = Numbers(10_000)
    before = _dfp(ds)
    ds.labels[4_321] = -1
    assert _dfp(ds) != before
    # end to end: the store filled from the old labels serves the new one
    old = Numbers(64)
    c = CachedDataset(old, double, store=tmp_path / "c")
    assert [float(c[i][0]) for i in range(64)] == [2.0 * i for i in range(64)]
    new = Numbers(64)
    new.labels[31] = 100
    c2 = CachedDataset(new, double, store=tmp_path / "c")
    assert float(c2[31][0]) == 200.0 and float(c2[30][0]) == 60.0


SEEDED = '''
import sys
sys.path.insert(0, {src!r})
from redline.data import CachedDataset
from redline.data.fingerprint import transform_fingerprint
KINDS = {{"cat", "dog", "bird", "fish"}}
def t(x):
    if x in {{"alpha", "beta", "gamma"}}:
        return {{"a", "b", "c"}} | KINDS
    return {{k: v for k, v in zip(sorted(KINDS), range(4))}}
class Data:
    def __init__(self):
        self.names = {{"x", "y", "z", "w"}}
        self.table = {{frozenset({{"p", "q"}}): 1, "r": {{"s", "t"}}}}
    def __len__(self):
        return 4
print(transform_fingerprint(t)[0], CachedDataset(Data(), t, store="/nonexistent").fingerprint)
'''


@pytest.mark.slow
def test_the_key_is_the_same_under_every_hash_seed(tmp_path: Path) -> None:
    script = tmp_path / "seeded.py"
    script.write_text(SEEDED.format(src=SRC))
    outs = set()
    for seed in ("1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                                check=True, env=env).stdout)
    assert len(outs) == 1, outs


class Holder(Dataset[int]):
    def __init__(self, data: Any) -> None:
        self.data = data

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


def test_fingerprinting_a_large_array_costs_bounded_memory() -> None:
    big = np.random.default_rng(0).integers(0, 255, size=(100, 2**20), dtype=np.uint8)
    holder = Holder(big)
    tracemalloc.start()
    try:
        a = _dfp(holder)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB for a 100 MiB array"
    tracemalloc.start()
    try:
        b = _dfp(Holder(big.T))  # not contiguous: copied a chunk at a time
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MiB for a 100 MiB strided array"
    assert a != b
    big[50, 12345] ^= 1  # one byte in the middle
    assert _dfp(holder) != a


RSS = '''
import resource, sys
sys.path.insert(0, {src!r})
import torch
from redline.data import CachedDataset
class D:
    def __init__(self, t):
        self.t = t
    def __len__(self):
        return 1
t = torch.ones(100, 2**18)  # 100 MiB of float32
for x in (t, t.t()):
    def scale(v, k=x):  # the tensor in the transform's defaults
        return v * k
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    CachedDataset(D(x), scale, store="/nonexistent")
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((after - before) * 1024)
'''


@pytest.mark.slow
def test_fingerprinting_a_large_tensor_costs_bounded_memory(tmp_path: Path) -> None:
    script = tmp_path / "rss.py"
    script.write_text(RSS.format(src=SRC))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         check=True).stdout.split()
    contiguous, strided = (int(x) for x in out)
    assert contiguous < 16 * 2**20 and strided < 16 * 2**20, out


def _adds(k: torch.Tensor) -> Any:
    return lambda x: x + k


def test_tensors_hash_by_content_whatever_their_layout() -> None:
    t = torch.arange(24, dtype=torch.float32).view(4, 6)
    ref = _fp(_adds(t))
    assert _fp(_adds(t.t().contiguous().t())) == ref  # the same values, other strides
    assert _fp(_adds(t.to(torch.bfloat16))) != ref
    assert _fp(_adds(t.to_sparse())) != ref
    z = t.clone()
    z[2, 3] = -1
    assert _fp(_adds(z)) != ref


def test_files_and_the_network_are_named_not_an_attribute_called_open() -> None:
    m = _module("import socket\n"
                "def reads(p):\n    with open(p) as f:\n        return f.read()\n"
                "def asks(h):\n    return socket.gethostbyname(h)\n"
                "def decodes(img):\n    return img.open().convert('RGB')\n")
    assert any("reads with open()" in u for u in transform_fingerprint(m["reads"])[1])
    assert any("(the network)" in u for u in transform_fingerprint(m["asks"])[1])
    assert transform_fingerprint(m["decodes"])[1] == []


def test_slots_and_namedtuple_fields_are_not_named_unseen() -> None:
    m = _module("import collections, functools\n"
                "Pair = collections.namedtuple('Pair', 'x y')\n"
                "class Slots:\n    __slots__ = ('data',)\n"
                "    def __init__(self, d):\n        self.data = d\n"
                "    def __len__(self):\n        return len(self.data)\n"
                "class Lazy:\n    @functools.cached_property\n    def k(self):\n        return 3\n"
                "    def __call__(self, x):\n        return x * self.k\n")
    assert transform_fingerprint(m["Lazy"]())[1] == []
    assert transform_fingerprint(_adds(m["Pair"](1, 2)))[1] == []
    from redline.data.fingerprint import dataset_fingerprint

    a, b = dataset_fingerprint(m["Slots"]([1, 2, 3])), dataset_fingerprint(m["Slots"]([1, 9, 3]))
    assert a[0] != b[0] and a[1] == b[1] == []
    # nor a dataset's lock (around a lazily opened file) or event, nor a deque's items
    import collections
    import threading

    guarded = Holder([threading.Lock(), threading.RLock(), threading.Event()])
    assert dataset_fingerprint(guarded)[1] == []
    assert dataset_fingerprint(Holder(collections.deque([1, 2])))[0] != dataset_fingerprint(
        Holder(collections.deque([1, 3])))[0]


class _Raising:
    """An array-like whose values cannot be read (as a GPU-only array without a host copy)."""

    shape = (3,)
    dtype = "float32"

    def tolist(self) -> list[float]:
        raise RuntimeError("no host copy")

    def __array__(self, *a: object, **k: object) -> Any:
        raise RuntimeError("no host copy")


def test_an_object_that_raises_when_read_is_named_not_a_crash() -> None:
    from redline.data.fingerprint import dataset_fingerprint

    key, unseen = dataset_fingerprint(Holder(_Raising()))
    assert len(key) == 16 and any("reading it raised RuntimeError" in u for u in unseen)
