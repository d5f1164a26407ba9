"""What a model check reports: a status and one finding per subject (shared by the checks of
:mod:`llamaforge.models.verify`; every front imports it for :data:`Status`, so it imports nothing heavy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail", "skipped"]


@dataclass(frozen=True)
class Finding:
    """One result of a check: ``subject`` names the tensor, key or field concerned."""

    check: str
    status: Status
    subject: str
    message: str
