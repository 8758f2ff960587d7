"""`redline doctor --live` under a pseudo-terminal: the panel is drawn and redrawn while the
script runs, the script's own lines all reach the terminal, and the final screen — after a
normal end and after Ctrl-C — holds the script's output and the report, not the panel.
The terminal is emulated by pyte (a VT100 emulator) fed every byte the run wrote."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pyte = pytest.importorskip("pyte")
SCRIPTS = Path(__file__).parent / "scripts"
COLS, ROWS = 140, 400


def _run_in_pty(steps: int, interrupt_after_s: float | None = None) -> tuple[bytes, int]:
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": str(COLS), "LINES": str(ROWS), "TERM": "xterm-256color"}
    env.pop("CI", None)  # rich treats CI as a non-interactive terminal
    p = subprocess.Popen(
        [sys.executable, "-m", "redline.cli.main", "doctor", "--live", "--no-flops",
         "--steps", "1000", "--", "python", str(SCRIPTS / "prints_while_training.py"),
         str(steps)], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
        start_new_session=True)
    os.close(slave)
    out = bytearray()
    start = time.monotonic()
    sent = False
    while True:
        if interrupt_after_s is not None and not sent and b"redline live" in out \
                and time.monotonic() - start > interrupt_after_s:
            os.killpg(p.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's process group
            sent = True
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
        assert time.monotonic() - start < 240, out[-2000:]
    os.close(master)
    return bytes(out), p.wait(timeout=60)


def _screen(raw: bytes) -> list[str]:
    screen = pyte.Screen(COLS, ROWS)
    stream = pyte.ByteStream(screen)
    stream.feed(raw)  # the pty turned each \n into \r\n, as a terminal gets it
    return [line.rstrip() for line in screen.display]


def test_the_panel_is_redrawn_while_the_script_prints_and_is_gone_at_the_end() -> None:
    raw, code = _run_in_pty(steps=100)
    assert code == 0, raw[-3000:]
    text = raw.decode(errors="replace")
    assert text.count("redline live ·") >= 3  # redrawn (≥ 3 s of steps, 2 redraws a second)
    assert "data_wait" in text and "so far:" in text
    lines = _screen(raw)
    shown = [ln for ln in lines if ln]
    assert not [ln for ln in shown if "redline live" in ln or "so far:" in ln]  # erased
    script = [ln for ln in shown if ln.startswith("script ")]
    expected = []
    for i in range(100):
        if i % 5 == 0:
            expected.append(f"script line {i}")
        if i % 20 == 0:
            expected.append(f"script warning {i}")
    assert script == [*expected, "script done"]
    assert any("redline ·" in ln for ln in shown)  # the report follows the script's output
    assert "\x1b[?25h" in text  # the cursor is shown again


def test_ctrl_c_leaves_a_clean_terminal_and_the_report_of_the_steps_so_far() -> None:
    raw, code = _run_in_pty(steps=2000, interrupt_after_s=2.0)
    assert code == 130, raw[-3000:]
    lines = [ln for ln in _screen(raw) if ln]
    assert not [ln for ln in lines if "redline live" in ln or "so far:" in ln]
    screen = "\n".join(lines[-120:])  # what the user saw last, in the failure message
    assert any("redline ·" in ln for ln in lines), screen
    assert any("interrupted" in ln.lower() for ln in lines), screen
    assert "script done" not in "\n".join(lines)
    assert "\x1b[?25h" in raw.decode(errors="replace")


def test_without_a_terminal_the_run_says_there_is_no_panel(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "redline.cli.main", "doctor", "--live",
                        "--no-flops", "--steps", "5", "--", "python",
                        str(SCRIPTS / "prints_while_training.py"), "20"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "the live panel needs a terminal on stderr" in p.stderr
    assert "redline live ·" not in p.stderr and "script line 0" in p.stdout
