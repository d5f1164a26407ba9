"""An upgrade's own directory: ``home()/upgrades/<id>/`` holds the candidate recipe and patch series, the
state a ``--resume`` reads, and the report. Nothing under ``recipes/`` or ``patches/`` is written here."""

from __future__ import annotations

import datetime
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaforge.build.patches import series_dir
from llamaforge.core.errors import InvalidOption
from llamaforge.core.paths import home, write_text_atomic

STATE = "upgrade.json"


def upgrades_root() -> Path:
    """Directory of every upgrade run."""
    return home() / "upgrades"


@dataclass(frozen=True)
class UpgradeDir:
    """One upgrade run's directory."""

    path: Path

    @property
    def series(self) -> Path:
        """The candidate patch series (a copy of the recipe's, rebased onto the new source)."""
        return self.path / "patches"

    @property
    def recipe(self) -> Path:
        """The candidate build recipe: the current one with the new source pin and the candidate series."""
        return self.path / "candidate.toml"

    def read_state(self) -> dict[str, Any]:
        """What the run recorded so far (its parameters, the resolved source, the refresh workspace)."""
        data: dict[str, Any] = json.loads((self.path / STATE).read_text(encoding="utf-8"))
        return data

    def write_state(self, state: dict[str, Any]) -> None:
        """Record the run's state, atomically."""
        write_text_atomic(self.path / STATE, json.dumps(state, indent=2, sort_keys=True) + "\n")


def new_upgrade_dir(recipe: str, old: str, new: str, series: str | None) -> UpgradeDir:
    """A fresh directory for an upgrade of ``recipe`` from ``old`` to ``new`` (labels such as bNNNN), with a
    copy of the recipe's patch series (``series`` None: a stock recipe, an empty series)."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    label = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{recipe}-{old}-to-{new}")[:80]
    directory = UpgradeDir(upgrades_root() / f"{stamp}-{label}")
    directory.path.mkdir(parents=True)
    if series is None:
        directory.series.mkdir()
        (directory.series / "series").write_text("# no patches\n", encoding="utf-8")
    else:
        shutil.copytree(series_dir(series), directory.series, symlinks=False)
    return directory


def find_upgrade_dir(reference: str) -> UpgradeDir:
    """The upgrade directory ``reference`` names: a path, or an id (or unique prefix) under the upgrades root."""
    root = upgrades_root()
    for candidate in (Path(reference), root / reference):
        if (candidate / STATE).is_file():
            return UpgradeDir(candidate)
    runs = sorted(path for path in root.iterdir() if (path / STATE).is_file()) if root.is_dir() else []
    # A prefix is matched as text, never as a glob: a path or a pattern in it names no run.
    matches = (
        [path for path in runs if path.name.startswith(reference)]
        if reference and "/" not in reference
        else []
    )
    if len(matches) == 1:
        return UpgradeDir(matches[0])
    known = [path.name for path in runs][-5:]
    raise InvalidOption(
        f"no upgrade run {reference!r}" + (f" ({len(matches)} runs start with it)" if matches else ""),
        hint="pass the directory an earlier `upgrade` printed"
        + (f"; the latest: {', '.join(known)}" if known else f" (none under {root})"),
    )
