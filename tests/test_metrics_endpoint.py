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
from redline.measure.step_record import PHASES

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
        with pytest.raises(redline.RedlineError, match=f"127.0.0.1:{port}.*`metrics_port`"), \
                redline.watch(metrics_port=port):
            pass
    assert (DataLoader.__iter__, _BaseDataLoaderIter.__next__) == before


def test_doctor_names_a_taken_port_by_its_flag(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The library names the field (`metrics_port`); the command shows its flag."""
    from redline.cli.main import main

    script = tmp_path / "never_runs.py"
    script.write_text("raise SystemExit('the script ran')\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code = main(["doctor", "--metrics-port", str(port), "--", "python", str(script)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"127.0.0.1:{port}" in err and "pick a free port with --metrics-port" in err, err


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


def test_a_real_prometheus_server_scrapes_the_endpoint_and_answers_a_query(
        tmp_path: Path) -> None:
    """Debian's `prometheus` (installed by .ci/run) scrapes a running watch every second on
    loopback; a PromQL query through its HTTP API gives back the watch's step count."""
    import json
    import shutil
    import threading
    import time

    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's prometheus server is not installed (apt-get install prometheus; "
                    ".ci/run installs it)")
    prom_port = _free_port()
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    answer: dict[str, Any] = {}
    done = threading.Event()
    with redline.watch(metrics_port=0, warmup_steps=2, count_flops=False) as w:
        assert w.metrics_server is not None
        target = f"127.0.0.1:{w.metrics_server.port}"
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: training\n"
            f"    static_configs:\n      - targets: ['{target}']\n")
        with open(tmp_path / "prometheus.log", "wb") as log:
            prom = subprocess.Popen(
                [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=subprocess.DEVNULL, stderr=log)

        def query() -> None:
            q = f"http://127.0.0.1:{prom_port}/api/v1/query?query="
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and prom.poll() is None:
                try:
                    got = {name: json.load(urllib.request.urlopen(q + name, timeout=5))
                           for name in ("redline_steps_total", "redline_step_time_seconds")}
                except (OSError, ValueError):
                    got = {}
                if got and all(r["data"]["result"] for r in got.values()):
                    answer.update(got)
                    break
                time.sleep(0.5)
            done.set()

        asker = threading.Thread(target=query, daemon=True)
        asker.start()
        try:
            while not done.is_set():  # keep training until Prometheus has an answer
                for x, y in DataLoader(data, batch_size=8):
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                    opt.zero_grad()
                time.sleep(0.01)
            steps_now = len(w.steps)
        finally:
            prom.terminate()
            prom.wait(timeout=30)
            asker.join(timeout=10)
    assert answer, (tmp_path / "prometheus.log").read_text()[-3000:]
    (series,) = answer["redline_steps_total"]["data"]["result"]
    assert series["metric"]["job"] == "training" and series["metric"]["rank"] == "0"
    assert series["metric"]["instance"] == target
    assert 3 <= float(series["value"][1]) <= steps_now  # past warm-up: step time is known
    (step_time,) = answer["redline_step_time_seconds"]["data"]["result"]
    assert 0 < float(step_time["value"][1]) < 1


def test_the_grafana_dashboard_queries_only_metrics_the_endpoint_serves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `redline_*` name in docs/grafana-redline.json's queries is a series the collector
    writes when everything is known (device busy and MFU included), and each is documented."""
    import json
    import re

    from prometheus_client import CollectorRegistry, generate_latest

    import redline.runs.metrics_server as prom
    from redline.measure.live import LiveSnapshot

    full = LiveSnapshot(steps_measured=10, window_steps=10, step_time_mean_s=0.1,
                        data_wait_fraction=0.2, samples_per_s=80.0, device_busy_fraction=0.7,
                        mfu=0.3, phase_fractions={p: 1 / (len(PHASES) + 1)
                                                  for p in (*PHASES, "other")},
                        steps_total=12)
    monkeypatch.setattr(prom, "live_snapshot", lambda w, window: full)
    with redline.watch(count_flops=False) as w:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(prom.WatchCollector(w))
        text = generate_latest(registry).decode()
    served = {s.name for f in parser.text_string_to_metric_families(text) for s in f.samples}
    root = Path(__file__).parent.parent
    dashboard = json.loads((root / "docs" / "grafana-redline.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    queried = {n for e in exprs for n in re.findall(r"\bredline_[a-z_]+", e)}
    assert queried and queried <= served, queried - served
    documented = set(re.findall(r"`(redline_[a-z_]+)", (root / "docs" / "report.md").read_text()))
    assert served == documented, served ^ documented
