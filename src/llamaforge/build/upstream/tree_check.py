"""What moved under a recipe between two llama.cpp trees, read from their CMake files before anything compiles.

:func:`check_tree` compares what the old and the new tree declare (:mod:`llamaforge.build.upstream.cmake_scan`)
with what the build sets (every ``-D`` option of its plan) and the targets it builds, and returns typed findings,
each with what to do:

* ``option-deprecated``: the build sets a name the new tree only maps to another option, ignores or refuses;
* ``option-gone``: the build sets an option the new tree no longer declares (CMake would only warn that it was
  not used), with the closest names it does declare;
* ``option-forced``: the new tree overwrites the build's value (``set(… CACHE … FORCE)``);
* ``default-changed``: an option's default moved; it matters only when the build does not set the option;
* ``target-renamed`` / ``target-gone``: a target the recipe builds is not defined any more; a rename is a new
  target in the directory the old one was defined in, or one that keeps its output name, or a close name;
* ``target-output-renamed``: the target is there but its binary has another name;
* ``option-new``: an option the new release adds (information: the recipe might want it).

CMake's own variables (``CMAKE_*``, ``BUILD_SHARED_LIBS``) are never "gone": CMake itself reads them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llamaforge.build.cmake_options import BACKEND_HINT, backend_cmake_keys
from llamaforge.build.upstream.cmake_scan import CMakeScan, Target, scan_tree

FindingKind = Literal[
    "option-deprecated",
    "option-gone",
    "option-forced",
    "default-changed",
    "target-renamed",
    "target-gone",
    "target-output-renamed",
    "option-new",
]
Severity = Literal["error", "warning", "info"]
_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CMAKE_OWN = re.compile(r"^(CMAKE_|CPACK_|CTEST_)|^(BUILD_SHARED_LIBS|BUILD_TESTING)$")
_FATAL = frozenset({"FATAL_ERROR", "SEND_ERROR"})
_SWITCHES = frozenset({"option", "cmake_dependent_option", "cache BOOL"})
_NOT_BUILT = ("examples/", "tests/", "scripts/")  # options only these declare are not the build's concern


@dataclass(frozen=True)
class TreeFinding:
    """One thing that moved under the recipe: its kind, the option or target, before and after, what to do, and
    how much it matters (error: the build fails; warning: it builds differently; info: worth knowing)."""

    kind: FindingKind
    name: str
    old: str | None
    new: str | None
    suggestion: str
    severity: Severity

    def to_json(self) -> dict[str, str | None]:
        """The finding as the upgrade report holds it."""
        return {
            "kind": self.kind,
            "name": self.name,
            "old": self.old,
            "new": self.new,
            "suggestion": self.suggestion,
        }


def check_tree(
    old_tree: Path, new_tree: Path, *, cmake: Mapping[str, str], targets: Sequence[str]
) -> list[TreeFinding]:
    """The findings for a build that sets ``cmake`` (name -> value) and builds ``targets``, moving from
    ``old_tree`` to ``new_tree``; errors first. Pure: both trees are only read."""
    old, new = scan_tree(old_tree), scan_tree(new_tree)
    sets = {name: value for name, value in cmake.items() if _VARIABLE_NAME.match(name)}
    findings = [
        *_options_set(old, new, sets),
        *_defaults(old, new, sets),
        *_targets(old, new, targets),
        *_new_options(old, new),
    ]
    return sorted(
        findings, key=lambda finding: (_SEVERITY_ORDER[finding.severity], finding.kind, finding.name)
    )


def _closest(name: str, candidates: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(name, sorted(candidates), n=3, cutoff=0.75)


def _options_set(old: CMakeScan, new: CMakeScan, sets: Mapping[str, str]) -> list[TreeFinding]:
    findings = []
    for name, value in sorted(sets.items()):
        if _CMAKE_OWN.match(name):
            continue
        deprecation = new.deprecations.get(name)
        if deprecation is not None and deprecation != old.deprecations.get(name):
            replacement = (
                f"{deprecation.new}={deprecation.value or value}" if deprecation.new is not None else None
            )
            if deprecation.level in _FATAL:
                advice = f"the new tree refuses {name} (configure fails, {deprecation.where})"
            else:
                advice = f"the new tree calls {name} deprecated ({deprecation.where})"
            if replacement and backend_cmake_keys([str(deprecation.new)]):
                advice += f": remove it ({replacement} is the backend's: {BACKEND_HINT})"
            else:
                advice += (
                    f": set {replacement} in [cmake] instead" if replacement else ": it is ignored, remove it"
                )
            findings.append(
                TreeFinding(
                    "option-deprecated",
                    name,
                    _declared(old, name, value),
                    f"deprecated ({deprecation.level})" + (f" → {replacement}" if replacement else ""),
                    advice,
                    "error" if deprecation.level in _FATAL else "warning",
                )
            )
            continue
        if name in new.options:
            forced = [option for option in new.options[name] if option.forced]
            if forced and not any(option.forced for option in old.options.get(name, [])):
                findings.append(
                    TreeFinding(
                        "option-forced",
                        name,
                        value,
                        f"forced to {forced[0].default}",
                        f"the new tree overwrites {name} ({forced[0].where}): the build's {name}={value} may "
                        "not apply; check the condition around it",
                        "warning",
                    )
                )
            continue
        if name in new.deprecations or (name not in old.options and name in new.words):
            continue  # as before, or a plain variable the tree reads (LLAMA_BUILD_NUMBER)
        close = _closest(name, new.options)
        advice = f"remove {name} from [cmake]" + (
            f", or set {' / '.join(close)} (declared now)" if close else ""
        )
        findings.append(
            TreeFinding(
                "option-gone",
                name,
                _declared(old, name, value),
                "not declared" + (" (still mentioned)" if name in new.words else ""),
                f"the new tree does not declare {name}, so setting it does nothing: {advice}",
                "warning",
            )
        )
    return findings


def _declared(scan: CMakeScan, name: str, value: str) -> str:
    where = scan.options[name][0].where if name in scan.options else None
    return f"{name}={value}" + (
        f" (declared at {where})" if where else " (not declared in the old tree either)"
    )


def _defaults(old: CMakeScan, new: CMakeScan, sets: Mapping[str, str]) -> list[TreeFinding]:
    findings = []
    for name in sorted(set(old.options) & set(new.options)):
        before, after = old.defaults(name), new.defaults(name)
        if before == after or _CMAKE_OWN.match(name):
            continue
        was, now = " | ".join(before), " | ".join(after)
        switch = any(option.how in _SWITCHES for option in new.options[name])
        if name in sets:
            advice = f"the build sets {name}={sets[name]}, so the new default does not apply"
            severity: Severity = "info"
        else:
            keep = f"set {name}={before[0]} in [cmake] to keep the old behaviour" if len(before) == 1 else ""
            advice = f"the build takes the default, so it now gets {now}" + (f"; {keep}" if keep else "")
            severity = (
                "warning" if switch else "info"
            )  # a switch changes what is built; a version or path less
        findings.append(TreeFinding("default-changed", name, was, now, advice, severity))
    return findings


def _targets(old: CMakeScan, new: CMakeScan, wanted: Sequence[str]) -> list[TreeFinding]:
    findings = []
    for name in wanted:
        before = old.targets.get(name)
        after = new.targets.get(name)
        if after is not None:
            if before is not None and (before.output_name or name) != (after.output_name or name):
                findings.append(
                    TreeFinding(
                        "target-output-renamed",
                        name,
                        before.output_name or name,
                        after.output_name or name,
                        f"{name} now builds {after.output_name or name} ({after.where}): scripts and units that "
                        f"run {before.output_name or name} need the new name",
                        "warning",
                    )
                )
            continue
        successor = _successor(name, before, old, new)
        if successor is not None:
            findings.append(
                TreeFinding(
                    "target-renamed",
                    name,
                    name + (f" ({before.where})" if before else ""),
                    f"{successor.name} ({successor.where})",
                    f"the new tree has no target {name}; build {successor.name} instead: replace it in the "
                    "recipe's targets",
                    "error",
                )
            )
            continue
        close = _closest(name, new.targets)
        findings.append(
            TreeFinding(
                "target-gone",
                name,
                name + (f" ({before.where})" if before else ""),
                None,
                f"the new tree defines no target {name} (the build would fail): remove it from the recipe's "
                "targets" + (f"; close names: {', '.join(close)}" if close else ""),
                "error",
            )
        )
    return findings


def _successor(name: str, before: Target | None, old: CMakeScan, new: CMakeScan) -> Target | None:
    """The target that took the place of ``name``: a new one with its output name, a new one of the same kind
    in its directory (the closest name first), or a new one with a close name."""
    added = [target for target_name, target in new.targets.items() if target_name not in old.targets]
    for target in added:
        if target.output_name == name:
            return target
    if before is not None:
        same_place = {t.name: t for t in added if t.directory == before.directory and t.kind == before.kind}
        if len(same_place) == 1:
            return next(iter(same_place.values()))
        close = difflib.get_close_matches(name, sorted(same_place), n=1, cutoff=0.5)
        if close:
            return same_place[close[0]]
    close = _closest(name, [target.name for target in added])
    return new.targets[close[0]] if close else None


def _new_options(old: CMakeScan, new: CMakeScan) -> list[TreeFinding]:
    findings = []
    for name in sorted(set(new.options) - set(old.options)):
        declared = [
            option
            for option in new.options[name]
            if not option.forced
            and (option.how in ("option", "cmake_dependent_option", "cache BOOL", "cache STRING"))
            and not option.where.startswith(_NOT_BUILT)
        ]
        if not declared or _CMAKE_OWN.match(name):
            continue
        default = " | ".join(dict.fromkeys(option.default for option in declared))
        doc = next((option.doc for option in declared if option.doc), "")
        findings.append(
            TreeFinding(
                "option-new",
                name,
                None,
                default,
                f"new in this release ({declared[0].where})"
                + (f": {doc}" if doc else "")
                + f"; set it in [cmake] to change the default {default}",
                "info",
            )
        )
    return findings
