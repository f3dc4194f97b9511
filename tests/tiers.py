"""The test tiers: every test belongs to exactly one, given from what it needs.

========== ==================================================================
unit       no OS process (but the standard library's probes, ``PROBES``), no
           real server: pure Python and in-process fakes (KubeFake, loopback
           fakes served from a thread). ``make test-fast``.
processes  spawns OS processes: torch workers, gang supervisors, the CLI or a
           helper script in a subprocess. Declared per module or per test
           (``pytestmark = pytest.mark.processes``), or given by a fixture
           (``PROCESS_FIXTURES``); a unit-only run refuses to start a process,
           so an undeclared one fails its test.
servers    starts real servers: SeaweedFS (S3), MLflow, Airflow's components.
           Given by the fixtures a test uses (``SERVER_FIXTURES``).
browser    drives a real Chromium against the local stack.
cluster    runs against a real Kubernetes control plane (tests/cluster).
research   tests of research/ (bounds, decompositions, replays bench/ measures with).
========== ==================================================================

A test belongs to the most expensive tier it needs (the order of ``TIERS`` below,
cheapest last); ``unit`` is given only to a test with no other. A declared marker
stays, so ``-m processes`` also picks a ``servers`` test that spawns processes:
``make test-processes`` leaves the costlier tiers out by name. ``slow``, the old name
of ``servers``, is still accepted.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TIERS = ("cluster", "browser", "servers", "processes", "research", "unit")
SERVER_FIXTURES = frozenset({"s3_endpoint", "mlflow_url", "stack"})
# these run `airflow db migrate` in a subprocess (the first worker to ask, once a run)
PROCESS_FIXTURES = frozenset({"airflow_home", "migrated_airflow_db"})
LEGACY = {"slow": "servers"}
CLUSTER_DIR = Path(__file__).parent / "cluster"
# Modules that share one running stack (tests/stack/conftest.py): one work unit, run in
# this order, since the browser test triggers digits again and may crown a new champion,
# which the stack tests' registry checks must not see.
SHARED_STACK = ("tests/stack/test_stack.py", "tests/stack/test_browser.py")


def tier_of(item: pytest.Item) -> str:
    """The one tier of ``item``: its declared markers, its fixtures, its folder."""
    declared = {LEGACY.get(mark.name, mark.name) for mark in item.iter_markers()}
    if CLUSTER_DIR in Path(str(item.path)).parents:
        declared.add("cluster")
    fixtures = set(getattr(item, "fixturenames", ()))
    if SERVER_FIXTURES & fixtures:
        declared.add("servers")
    if PROCESS_FIXTURES & fixtures:
        declared.add("processes")
    return next((tier for tier in TIERS if tier in declared), "unit")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank: dict[str, int] = {}
    size: Counter[str] = Counter()
    for item in items:
        tier = tier_of(item)
        item.add_marker(tier)
        unit = work_unit(item.nodeid)
        rank[unit] = min(rank.get(unit, len(TIERS)), TIERS.index(tier))
        size[unit] += 1
    # The costliest work units first, the costliest tier first and, within a tier, the
    # most tests first (the longest first is the best greedy order for the workers);
    # stable, so a module keeps its own order.
    items.sort(
        key=lambda item: (
            rank[work_unit(item.nodeid)],
            -size[work_unit(item.nodeid)],
            _place_in_shared_stack(item.nodeid),
        )
    )


def work_unit(nodeid: str) -> str:
    """What one worker runs whole under ``pytest -n`` (``make test``): the cluster tier
    (one control plane for the session), the modules of ``SHARED_STACK`` (one local
    stack), else a test's module (its module fixtures start once)."""
    if nodeid.startswith("tests/cluster/"):
        return "cluster"
    module = nodeid.split("::", 1)[0]
    return SHARED_STACK[0] if module in SHARED_STACK else module


def _place_in_shared_stack(nodeid: str) -> int:
    module = nodeid.split("::", 1)[0]
    return SHARED_STACK.index(module) if module in SHARED_STACK else 0


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, called only where it runs
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    # xdist would hand out work units by their number of tests, so the one-test browser
    # module would start last and run alone; keep the collection's order (costliest first).
    config.option.loadscopereorder = False
    return ByWorkUnit(config, log)


class ProcessInUnitTestError(RuntimeError):
    """A ``unit`` test tried to start an OS process."""


# The standard library's own probes of the machine (``uname -p`` behind
# platform.platform(), ``ldconfig -p`` behind ctypes.util.find_library()): libraries
# run them on import, once, whatever the test; they are not the test's processes.
PROBES = frozenset({"platform", "ctypes.util"})


def _probing() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") in PROBES:
            return True
        frame = frame.f_back
    return False


def _refusing(original: Callable[..., Any], what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        if _probing():
            return original(*args, **kwargs)
        raise ProcessInUnitTestError(
            f"a `unit` test started a process ({what}): declare it with "
            "`pytestmark = pytest.mark.processes` (or mark the test) so that "
            "`make test-fast` stays free of processes"
        )

    return refuse


SPAWNERS: list[tuple[Any, str]] = [
    (subprocess.Popen, "__init__"),
    (multiprocessing.process.BaseProcess, "start"),
    *((os, name) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")),
]


def pytest_collection_finish(session: pytest.Session) -> None:
    """When every selected test is ``unit``, no process may start for the rest of the run."""
    if not session.items or any(tier_of(item) != "unit" for item in session.items):
        return
    patch = pytest.MonkeyPatch()
    for owner, name in SPAWNERS:
        if hasattr(owner, name):
            what = f"{getattr(owner, '__name__', owner)}.{name}"
            patch.setattr(owner, name, _refusing(getattr(owner, name), what))
    session.config.add_cleanup(patch.undo)
