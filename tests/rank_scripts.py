"""Run a script of tests/scripts under torchrun (gloo, CPU) and read what each rank wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).parent / "scripts"


def run_ranks(script: str, out: Path, ranks: int = 2, timeout: float = 240) -> list[Any]:
    """``torchrun --nproc_per_node=ranks scripts/<script> <out>``; every rank writes
    ``out/rank<i>.json``; returns them in rank order."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", str(ranks), str(SCRIPTS / script), str(out)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    written = all((out / f"rank{i}.json").exists() for i in range(ranks))
    # Gloo's teardown can abort a process after its work is done, when its worker threads
    # still hold a finished collective's objects (pytorch/pytorch#190489): the results were
    # written before it, so only that abort, and only after every result, is tolerated.
    teardown_abort = written and "terminate called without an active exception" in r.stderr
    assert r.returncode == 0 or teardown_abort, r.stderr[-3000:]
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(ranks)]
