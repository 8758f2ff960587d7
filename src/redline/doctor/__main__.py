"""``python -m redline.doctor OPTIONS_JSON -- CMD...``: one rank of a launcher's job under
doctor (the command :func:`redline.doctor.launch.rank_command` writes)."""

from __future__ import annotations

import sys

from redline.core.errors import RedlineError
from redline.doctor.options import DoctorError, DoctorOptions
from redline.doctor.runner import run_doctor


def main(argv: list[str]) -> int:
    """Run one rank; return its exit code (2: a usage error, 1: a report not written)."""
    if len(argv) < 2 or argv[1] != "--":
        print("redline doctor (rank): error: expected OPTIONS_JSON -- CMD..., got "
              f"{argv[:3]!r}", file=sys.stderr)
        return 2
    try:
        return run_doctor(argv[2:], DoctorOptions.from_json(argv[0])).exit_code
    except DoctorError as e:
        print(f"redline doctor (rank): error: {e}", file=sys.stderr)
        return 2
    except (OSError, RedlineError) as e:
        print(f"redline doctor (rank): error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
