"""Processes released together by a barrier, for races between processes that open
one file at the same moment (Airflow's scheduler, workers and triggerer after an
upgrade)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


def _released(
    opener: Callable[..., object], args: tuple[Any, ...], barrier: Any, errors: Any
) -> None:
    barrier.wait()
    try:
        opener(*args)
    except Exception as exc:  # the caller reports any failure
        errors.put(repr(exc))


def open_at_once(opener: Callable[..., object], args: tuple[Any, ...], processes: int) -> list[str]:
    """Call ``opener(*args)`` in ``processes`` forked processes at once; the errors
    they raised. Every process must exit cleanly within a minute."""
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    barrier = context.Barrier(processes)
    workers = [
        context.Process(target=_released, args=(opener, args, barrier, errors))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert all(worker.exitcode == 0 for worker in workers), [w.exitcode for w in workers]
    found = []
    while not errors.empty():
        found.append(errors.get())
    return found
