"""The live Prometheus endpoint: scraped during a run and parsed with the client library's own
parser, its values are the running watch's; it binds to loopback by default, releases its port
at exit, and says what to do when the port is taken or the library is missing."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import redline
from redline.measure.live import live_snapshot
from redline.measure.timeline import PHASES

parser = pytest.importorskip("prometheus_client.parser")
SCRIPTS = Path(__file__).parent / "scripts"


def _scrape(url: str) -> dict[str, list[Any]]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {f.name: f.samples for f in parser.text_string_to_metric_families(text)}


def _value(fams: dict[str, list[Any]], name: str, **labels: str) -> float:
    (s,) = [s for s in fams[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    return float(s.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_scrape_during_the_run_reads_the_running_watch() -> None:
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(320, 16), torch.randint(0, 4, (320,)))
    with redline.watch(metrics_port=0, warmup_steps=2, count_flops=False) as w:
        server = w.metrics_server
        assert server is not None and server.address == "127.0.0.1" and server.port > 0
        early = _scrape(server.url)  # warm-up: only what is known
        assert "redline_step_time_seconds" not in early
        for i, (x, y) in enumerate(DataLoader(data, batch_size=8)):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            if i == 30:
                fams = _scrape(server.url)
                snap = live_snapshot(w, 50)  # the same steps: this thread made no step since
        url = server.url
    assert snap is not None
    assert _value(fams, "redline_steps", rank="0") == snap.steps_total == 31
    assert _value(fams, "redline_steps_measured", rank="0") == snap.steps_measured == 29
    assert _value(fams, "redline_step_time_seconds") == snap.step_time_mean_s
    assert _value(fams, "redline_data_wait_share") == snap.data_wait_fraction
    assert _value(fams, "redline_samples_per_second") == snap.samples_per_s
    shares = {s.labels["phase"]: s.value for s in fams["redline_phase_share"]}
    assert set(shares) == {*PHASES, "other"} and sum(shares.values()) == pytest.approx(1.0)
    assert _value(fams, "redline_info", version=redline.__version__, device="cpu") == 1
    assert "redline_mfu" not in fams and "redline_device_busy_share" not in fams  # CPU: unknown
    with pytest.raises(urllib.error.URLError):  # the port is released at exit
        urllib.request.urlopen(url, timeout=2)


def test_a_taken_port_is_an_error_that_names_it_and_leaves_nothing_installed() -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    before = (DataLoader.__iter__, _BaseDataLoaderIter.__next__)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(redline.RedlineError, match=f"127.0.0.1:{port}.*--metrics-port"), \
                redline.watch(metrics_port=port):
            pass
    assert (DataLoader.__iter__, _BaseDataLoaderIter.__next__) == before


def test_doctor_serves_the_script_its_metrics(tmp_path: Path) -> None:
    port = _free_port()
    p = subprocess.run([sys.executable, "-m", "redline.cli.main", "doctor", "--steps", "40",
                        "--no-flops", "--metrics-port", str(port), "--", "python",
                        str(SCRIPTS / "scrapes_itself.py"), str(port)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"live metrics at http://127.0.0.1:{port}/metrics" in p.stderr
    text = p.stdout.split("SCRAPE-BEGIN\n", 1)[1].split("SCRAPE-END", 1)[0]
    fams = {f.name: f.samples for f in parser.text_string_to_metric_families(text)}
    assert _value(fams, "redline_steps", rank="0") == 21  # scraped inside step 21
    assert 0 < _value(fams, "redline_step_time_seconds") < 1


def test_without_the_client_library_the_error_says_how_to_install_it() -> None:
    code = ("import sys; sys.modules['prometheus_client'] = None\nimport redline\n"
            "try:\n    redline.watch(metrics_port=0).__enter__()\n"
            "except redline.RedlineError as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "pip install 'redline[metrics]'" in p.stdout, p.stderr
