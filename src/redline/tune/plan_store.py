"""Tuned plans on disk: a plan's JSON file (:func:`save_plan`, :func:`load_plan`) and the plans
remembered per model, device and inputs (:class:`PlanStore`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from redline.core.files import write_text_atomic
from redline.tune.knobs import TunePlan
from redline.tune.tuned import PlanCore, PlanKey, TunePlanError


def save_plan(plan: PlanCore, path: str | os.PathLike[str]) -> None:
    """Write the plan as JSON (atomically: a crash leaves no half-written file).

    Args:
        plan: the plan to write.
        path: the destination file; its folder must exist.

    Raises:
        OSError: the folder is missing or not writable, or the disk is full (the path named).
    """
    write_text_atomic(json.dumps(plan.to_dict(), indent=2) + "\n", path)


def load_plan(path: str | os.PathLike[str]) -> TunePlan:
    """Read a plan written by :func:`save_plan` or ``redline tune``.

    Args:
        path: the plan's JSON file.

    Returns:
        The :class:`TunePlan`.

    Raises:
        FileNotFoundError: no file at ``path``.
        TunePlanError: the file is not a usable plan; the message names it and says why.
    """
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except FileNotFoundError:
        raise FileNotFoundError(f"no plan at {str(path)!r}: run `redline tune SCRIPT` to make "
                                "one") from None
    except UnicodeDecodeError as e:
        raise TunePlanError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason}); expected a "
                        "plan written by redline tune") from None
    except json.JSONDecodeError as e:
        raise TunePlanError(f"{path} is not JSON ({e}); expected a plan written by redline tune") \
            from None
    if not isinstance(data, dict):
        raise TunePlanError(f"{path} holds a JSON {type(data).__name__}, expected a redline plan")
    try:
        return TunePlan.from_dict(data)
    except (TypeError, ValueError) as e:
        raise TunePlanError(f"{path} is not a usable redline plan: {e}") from None


class PlanStore:
    """Plans remembered on disk, one JSON file per key digest.

    Default folder: ``$REDLINE_CACHE_DIR/plans`` or ``~/.cache/redline/plans``.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        if root is None:
            base = os.environ.get("REDLINE_CACHE_DIR") or os.path.join(
                os.path.expanduser("~"), ".cache", "redline")
            root = os.path.join(base, "plans")
        self.root = Path(root)

    def path(self, key: PlanKey) -> Path:
        return self.root / f"{key.digest()}.json"

    def get(self, key: PlanKey) -> TunePlan | None:
        file = self.path(key)
        if not file.exists():
            return None
        try:
            plan = load_plan(file)
        except (ValueError, OSError):
            return None  # unreadable or from another version: tune again
        return plan if plan.key == key else None

    def put(self, plan: PlanCore) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        file = self.path(plan.key)
        save_plan(plan, file)
        return file
