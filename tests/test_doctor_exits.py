"""`redline doctor`'s exit paths: a report of what was measured on every one, or a sentence
why not (docs/reliability.md, "A report on every exit path")."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from redline.cli.main import main

HERE = Path(__file__).parent
SCRIPTS = HERE / "scripts"
pytestmark = pytest.mark.slow


def doctor(*args: str, cwd: Path = SCRIPTS, timeout: float = 120
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "redline.cli.main", "doctor", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "120"})


def _script(tmp: Path, body: str, name: str = "train.py") -> Path:
    p = tmp / name
    p.write_text(body)
    return p


LOOP = """
import torch
from torch import nn
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def step():
    nn.functional.mse_loss(model(torch.randn(2, 4)), torch.randn(2, 1)).backward()
    opt.step()
    opt.zero_grad()
"""


# -- outputs are checked before the run ------------------------------------------------------
@pytest.mark.parametrize("flag", ["--json", "--html", "--timeline"])
def test_an_output_naming_a_folder_fails_before_the_script_runs(
        tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    ran = tmp_path / "ran"
    script = _script(tmp_path, f"open({str(ran)!r}, 'w').close()\n")
    folder = tmp_path / "out"
    folder.mkdir()
    assert main(["doctor", flag, str(folder), "--", "python", str(script)]) == 2
    err = capsys.readouterr().err
    assert f"{flag} {str(folder)!r} is an existing directory; give the path of a file" in err
    assert not ran.exists()


def test_an_output_in_a_read_only_or_file_parent_fails_before_the_script_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    ran = tmp_path / "ran"
    script = _script(tmp_path, f"open({str(ran)!r}, 'w').close()\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (
        False if Path(p) == locked and mode & os.W_OK else real_access(p, mode, **kw)))
    assert main(["doctor", "--json", str(locked / "r.json"), "--", "python",
                 str(script)]) == 2
    assert f"directory {str(locked)!r} is not writable; create it or give another path" \
        in capsys.readouterr().err
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["doctor", "--html", str(afile / "r.html"), "--", "python", str(script)]) == 2
    assert f"{str(afile)!r} is a file, not a directory" in capsys.readouterr().err
    assert not ran.exists()


@pytest.mark.parametrize("flag", ["--plan", "--json"])
def test_tune_checks_its_outputs_before_tuning(tmp_path: Path, flag: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    t0 = time.monotonic()
    assert main(["tune", str(SCRIPTS / "tune_tiny.py"), flag, str(folder)]) == 2
    assert f"{flag} {str(folder)!r} is an existing directory" in capsys.readouterr().err
    assert time.monotonic() - t0 < 30  # refused before the first trial


# -- a signal to the whole process group -----------------------------------------------------
def _start(out: Path, *cmd: str, steps: str = "100000") -> subprocess.Popen[str]:
    """doctor in its own process group (as a shell job, or under ``timeout`` or Slurm)."""
    return subprocess.Popen(
        [sys.executable, "-m", "redline.cli.main", "doctor", "--steps", steps, "--warmup", "2",
         "--no-flops", "--json", str(out), "--", "python", *cmd],
        cwd=SCRIPTS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


def _wait_for(proc: subprocess.Popen[str], word: str, timeout: float = 60) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if word in line or not line:
            return


def test_a_sigterm_to_the_process_group_ends_with_the_report_and_no_worker_traceback(
        tmp_path: Path) -> None:
    """The DataLoader workers get the group's signal too and die; their deaths (PyTorch's
    SIGCHLD handler) must not raise in the middle of the report."""
    for i in range(3):  # the race was lost most of the time, not always
        out, pids = tmp_path / f"r{i}.json", tmp_path / f"pids{i}"
        pids.mkdir()
        proc = _start(out, "workers_forever.py", str(pids))
        _wait_for(proc, "READY")
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert "Traceback" not in err and "RuntimeError" not in err, err[-3000:]
        assert proc.returncode == 128 + signal.SIGTERM
        data = json.loads(out.read_text())
        assert data["status"] == "interrupted"
        assert data["measurements"]["timing"]["steps_total"] >= 12


SERVE_IN_A_DYING_WORKER = """
import os, signal, socket, sys, time, multiprocessing as mp
from multiprocessing import resource_sharer
from redline.doctor.exits import Signals

def worker(conn):
    # A DataLoader worker as a group's SIGTERM reaches it while the main process fetches a
    # tensor from it: the signal is pending (held here until its file-descriptor server has
    # run; on a loaded machine the worker's main thread is simply not scheduled yet), and the
    # main process hangs up in the middle of the connection's handshake.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # PyTorch's worker handler, for a signal
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # its parent did not send
    r, w = os.pipe()
    shared = resource_sharer.DupFd(r)  # starts the thread that serves descriptors
    os.kill(os.getpid(), signal.SIGTERM)
    conn.send(shared._id[0])
    conn.recv()  # the peer has hung up
    time.sleep(1.0)  # the server thread's turn
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    time.sleep(30)

def run():
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    p = ctx.Process(target=worker, args=(there,))
    p.start()
    peer = socket.socket(socket.AF_UNIX)
    peer.connect(here.recv())
    peer.close()
    here.send(None)
    p.join(30)
    print("worker exit code", p.exitcode, flush=True)

if sys.argv[1] == "doctor":
    with Signals():
        run()
else:
    run()
"""


@pytest.mark.parametrize("under", ["doctor", "bare"])
def test_a_worker_ending_by_the_group_s_sigterm_prints_no_traceback(tmp_path: Path,
                                                                    under: str) -> None:
    """The thread that serves a worker's tensors sees its peer hang up while the worker's
    SIGTERM is pending: under doctor's signal handling (inherited by the fork) nothing is
    printed, and the worker still ends by the signal; bare, Python prints the traceback that
    a group's SIGTERM would cut into the report."""
    script = _script(tmp_path, SERVE_IN_A_DYING_WORKER)
    p = subprocess.run([sys.executable, str(script), under], capture_output=True, text=True,
                       timeout=60)
    assert f"worker exit code {-signal.SIGTERM}" in p.stdout, p.stdout + p.stderr
    if under == "doctor":
        assert "Traceback" not in p.stderr, p.stderr
    else:
        assert "resource_sharer.py" in p.stderr and "_serve" in p.stderr, p.stderr

# -- os._exit ----------------------------------------------------------------------------------
def test_os_exit_in_the_script_ends_with_the_report_and_its_exit_code(tmp_path: Path) -> None:
    """``os._exit`` still ends the process at once (the script's ``finally`` does not run),
    after the report of the steps measured."""
    script = _script(tmp_path, LOOP + """
import os
try:
    for _ in range(8):
        step()
    print("about to exit", flush=True)
    os._exit(3)
finally:
    print("FINALLY RAN", flush=True)
""")
    out = tmp_path / "r.json"
    p = doctor("--warmup", "1", "--no-flops", "--json", str(out), "--", "python", str(script))
    assert p.returncode == 3, p.stderr[-2000:]
    assert "about to exit" in p.stdout and "FINALLY RAN" not in p.stdout
    data = json.loads(out.read_text())
    assert data["status"] == "script_error"
    assert data["status_detail"] == "the script ended with os._exit(3)"
    assert data["measurements"]["timing"]["steps_total"] == 8
    assert "Where each step's time goes" in p.stderr


def test_os_exit_from_another_thread_says_the_report_is_lost(tmp_path: Path) -> None:
    script = _script(tmp_path, LOOP + """
import os, threading, time
for _ in range(4):
    step()
threading.Thread(target=os._exit, args=(5,), name="watchdog").start()
time.sleep(30)
""")
    p = doctor("--no-flops", "--", "python", str(script), timeout=60)
    assert p.returncode == 5
    assert ("the script called os._exit(5) from thread 'watchdog', which ends the process at "
            "once: no report") in p.stderr


# -- a script that catches redline's stop ------------------------------------------------------
CATCHING = {
    "an except around the whole epoch": """
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
for _ in range(200):
    try:
        for x, y in loader:
            step()
    except:  # noqa: E722
        pass
""",
    "except BaseException: continue, no DataLoader": """
for _ in range(5000):
    try:
        step()
    except BaseException:
        continue
""",
    "a generator of batches": """
def batches():
    for _ in range(5000):
        yield None
for _ in batches():
    try:
        step()
    except:  # noqa: E722
        pass
""",
}


@pytest.mark.parametrize("form", list(CATCHING))
def test_the_step_limit_holds_however_the_script_catches_the_stop(tmp_path: Path,
                                                                  form: str) -> None:
    script = _script(tmp_path, LOOP + CATCHING[form] + "print('RAN TO ITS END', flush=True)\n")
    out = tmp_path / "r.json"
    p = doctor("--steps", "5", "--warmup", "1", "--no-flops", "--json", str(out), "--",
               "python", str(script))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "RAN TO ITS END" not in p.stdout
    data = json.loads(out.read_text())
    assert data["status"] == "step_limit"
    assert "caught redline's stop 3 time(s)" in data["status_detail"]
    assert 5 <= data["measurements"]["timing"]["steps_measured"] <= 5 + 3
    assert "Where each step's time goes" in p.stderr


# -- the report never imports what the run did not use -----------------------------------------
POISONED = LOOP + """
import sys, types
import redline
from redline.report.json_io import write_json
w = redline.watch(warmup_steps=1, count_flops=False)
with w:
    for _ in range(5):
        step()
# A Ctrl-C during a lazy import leaves sympy half-initialised and what imported it gone.
for name in [m for m in sys.modules
             if m.split(".")[0] == "sympy" or m.startswith("torch.distributed.fsdp")]:
    del sys.modules[name]
sys.modules["sympy"] = types.ModuleType("sympy")
write_json(w.report(show=False), sys.argv[1])
print("fsdp imported:", "torch.distributed.fsdp" in sys.modules)
"""


def test_the_report_is_built_beside_a_half_imported_sympy(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(_script(tmp_path, POISONED)), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "fsdp imported: False" in p.stdout
    assert json.loads(out.read_text())["measurements"]["timing"]["steps_measured"] == 4


# -- torch.multiprocessing.spawn ---------------------------------------------------------------
def test_processes_started_with_mp_spawn_are_measured_as_ranks(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = doctor("--warmup", "2", "--no-flops", "--json", str(out), "--",
               "python", "spawn_train.py", "12", timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "spawned job done" in p.stdout  # the script ran on after its ranks, as without
    assert "measured as ranks; rank 0 printed the job's merged report" in p.stderr
    data = json.loads(out.read_text())
    assert data["status"] == "completed"
    ranks = data["ranks"]
    assert ranks["world_size"] == 2 and ranks["missing"] == []
    assert [(e["rank"], e["status"], e["steps_measured"]) for e in ranks["ranks"]] == [
        (0, "completed", 10), (1, "completed", 10)]


# -- a rank that hangs -------------------------------------------------------------------------
def test_at_ctrl_c_the_report_names_the_rank_that_stopped_progressing(tmp_path: Path) -> None:
    """Rank 1 sleeps forever after 6 steps, rank 0 waits for it in the next all-reduce; Ctrl-C
    to doctor (torchrun passes it on): the report says rank 1 held the job up, and where.
    Rank 0's main thread is blocked in gloo's wait, where Python cannot run its signal
    handler: the report is then made from another thread (BlockedWatch)."""
    out = tmp_path / "r.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "redline.cli.main", "doctor", "--warmup", "1", "--no-flops",
         "--json", str(out), "--", "torchrun", "--nproc-per-node", "2", "--master-port",
         str(port), "ddp_one_rank_hangs.py"],
        cwd=SCRIPTS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    _wait_for(proc, "RANK 1 HANGS", timeout=120)
    time.sleep(3)  # both ranks' beacons publish where they are (every second)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    data = json.loads(out.read_text())
    assert data["status"] == "interrupted"
    detail = data["status_detail"]
    assert "rank(s) 1 stopped progressing (the others wait for them)" in detail, detail
    assert "rank 1: 6 step(s), last progress" in detail
    assert "ddp_one_rank_hangs.py:" in detail  # where each rank was
    assert "rank(s) 1 stopped progressing" in " ".join(err.split())



def test_processes_started_with_fork_are_said_to_be_unmeasured(tmp_path: Path) -> None:
    script = _script(tmp_path, LOOP + """
import torch.multiprocessing as mp
def train(i):
    for _ in range(3):
        step()
if __name__ == "__main__":
    mp.start_processes(train, nprocs=2, start_method="fork")
""")
    out = tmp_path / "r.json"
    p = doctor("--no-flops", "--json", str(out), "--", "python", str(script))
    assert p.returncode == 0, p.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["status"] == "no_steps"
    assert ("started 2 process(es) with torch.multiprocessing's start_method='fork', which "
            "redline does not measure") in data["status_detail"]


def test_an_optional_section_that_fails_is_unknown_and_said_not_a_lost_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from torch import nn

    import redline
    import redline.measure.summary as summary
    from redline.measure.ddp import ParallelSnapshot, ddp_stats
    from redline.measure.optional import SectionUnknown, optional_section
    from redline.report.json_io import write_json

    with pytest.warns(SectionUnknown, match="the DDP section could not be built"):
        assert ddp_stats(ParallelSnapshot(ddp_logging={"bucket_sizes": "x,y"}), [], 3, {}) is None

    def broken(*args: object) -> None:
        raise AttributeError("module 'sympy' has no attribute 'printing'")

    monkeypatch.setattr(summary, "fsdp_stats", optional_section("FSDP")(broken))
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with redline.watch(warmup_steps=1, count_flops=False) as w:
        for _ in range(4):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    report = w.report(show=False)
    assert report.measurements.fsdp is None
    assert ("the FSDP section could not be built (AttributeError: module 'sympy' has no "
            "attribute 'printing'); it is unknown in this report") in report.measurements.notes
    assert report.measurements.timing.steps_measured == 3
    write_json(report, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["measurements"]["fsdp"] is None


def _signal_inside(kind: str, fired: list[bool]) -> None:
    """Raise SIGINT inside code whose exceptions Python drops: a gc callback, or a weakref
    callback run by a collection (``fired`` is set when it was raised)."""
    import gc
    import signal as signals_module
    import weakref

    def raise_here() -> None:
        if not fired:
            fired.append(True)
            signals_module.raise_signal(signals_module.SIGINT)  # handled here, in the callback
            for _ in range(100):  # bytecode for the pending signal to be handled at
                pass

    if kind == "gc":
        def callback(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                raise_here()

        gc.callbacks.append(callback)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(callback)
    else:
        class Node:
            pass

        node = Node()
        node.cycle = node  # type: ignore[attr-defined]  # freed only by the collector
        keep = weakref.ref(node, lambda _ref: raise_here())
        del node
        gc.collect()
        del keep


@pytest.mark.parametrize("kind", ["gc", "weakref"])
def test_ctrl_c_handled_where_python_drops_exceptions_is_not_lost(kind: str) -> None:
    """A signal handler runs wherever the main thread is; in a gc or weakref callback what it
    raises is printed as "Exception ignored" and dropped. Doctor's handler is put back and the
    signal sent again, so the run still ends as interrupted."""
    import time

    from redline.doctor.exits import Signals

    fired: list[bool] = []
    with Signals() as received, pytest.raises(KeyboardInterrupt):
        _signal_inside(kind, fired)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the script goes on: the signal comes again
            time.sleep(0.001)
    assert fired and received.received == signal.SIGINT


@pytest.mark.parametrize("kind", ["gc", "weakref"])
def test_ctrl_c_dropped_under_a_watch_reaches_the_users_script(kind: str) -> None:
    """In the user's own script under redline.watch (Python's Ctrl-C handler), a
    KeyboardInterrupt dropped in a gc or weakref callback (the watch's GC pause timer is one)
    makes the same Ctrl-C arrive again."""
    import time

    import redline

    # Python's own handler, as in a script run from a terminal (a suite started in the
    # background by a shell without job control inherits SIGINT ignored)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    fired: list[bool] = []
    try:
        with pytest.raises(KeyboardInterrupt), redline.watch(count_flops=False):
            _signal_inside(kind, fired)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.001)
    finally:
        signal.signal(signal.SIGINT, before)
    assert fired


@pytest.mark.parametrize("own_handler", [False, True], ids=["redline's", "the script's"])
def test_a_sigterm_as_the_watch_closes_after_a_failed_script_still_writes_the_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_handler: bool) -> None:
    """torchrun stops the surviving ranks with SIGTERM when one dies, often just after the
    survivor's collective has failed: the signal then lands while the watch closes. The script
    has ended by then, so the signal must not interrupt the report of its error — also where
    the script installed a SIGTERM handler of its own that exits (preemption handling)."""
    from redline.doctor import DoctorOptions, run_doctor
    from redline.measure.recorder import Recorder

    close = Recorder.close

    def close_with_a_signal(self: Recorder, error: BaseException | None = None) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode, inside close
        close(self, error)

    monkeypatch.setattr(Recorder, "close", close_with_a_signal)
    before = signal.getsignal(signal.SIGTERM)
    own = ("import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
           if own_handler else "")
    script = _script(tmp_path, LOOP + own + """
for _ in range(6):
    step()
raise RuntimeError("Connection reset by peer")
""")
    out = tmp_path / "r.json"
    r = run_doctor(["python", str(script)],
                   DoctorOptions(warmup=1, count_flops=False, json_path=str(out)), show=False)
    assert r.report is not None and r.exit_code == 1
    data = json.loads(out.read_text())
    assert data["status"] == "script_error"
    assert "Connection reset by peer" in data["status_detail"]
    assert data["measurements"]["timing"]["steps_total"] == 6
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are put back


def test_a_ctrl_c_that_leaves_exec_d_code_still_ends_with_status_130(tmp_path: Path) -> None:
    """A Ctrl-C that lands in code run by ``exec`` of a string (a dataclass being created while
    the script imports) is marked unhandled by CPython; under ``python -m`` the process would
    then kill itself with SIGINT after the report instead of exiting 130."""
    script = _script(tmp_path, 'exec("raise KeyboardInterrupt")\n')
    p = doctor("--no-flops", "--json", str(tmp_path / "r.json"), "--", "python", str(script),
               cwd=tmp_path)
    assert p.returncode == 130, p.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "interrupted"


def test_a_reader_that_goes_away_neither_changes_the_status_nor_loses_the_report(
        tmp_path: Path) -> None:
    """``redline doctor … 2>&1 | head -1``: the report's lines meet a broken pipe. The run
    still writes its JSON and ends with the script's own status."""
    script = _script(tmp_path, LOOP + "for _ in range(8):\n    step()\n"
                     "print('trained', flush=True)\nraise SystemExit(3)\n")
    out = tmp_path / "r.json"
    p = subprocess.Popen([sys.executable, "-m", "redline.cli.main", "doctor", "--no-flops",
                          "--json", str(out), "--", "python", str(script)], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.stdout is not None
    first = p.stdout.readline()
    p.stdout.close()  # as `head -1` does after its line
    assert p.wait(timeout=120) == 3, first
    report = json.loads(out.read_text())
    assert report["status"] == "script_error"
    assert report["measurements"]["timing"]["steps_total"] >= 1
