"""Run a trigger as the triggerer does: rebuild it from serialize(), then take its event."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any


def round_trip(trigger: Any) -> Any:
    """Serialize and rebuild the trigger, as a (restarted) triggerer does when it picks it up."""
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)
    return rebuilt


def first_event(trigger: Any, timeout_s: float = 60) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(run(), timeout=timeout_s))
