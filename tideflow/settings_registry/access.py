"""Typed reads of the declared settings: every ``TIDEFLOW_*`` read goes through these.

Each takes the environment to read (``os.environ`` unless given) and checks the
value against its declaration; an undeclared name is a programming error
(``KeyError``), a value the declaration refuses a ``ConfigError`` naming it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from tideflow.settings_registry.declared import BY_NAME, SETTINGS
from tideflow.settings_registry.model import FLAG_WORDS, Reader, Setting, bad_setting

Environ = Mapping[str, str] | None


def declared(name: str) -> Setting:
    """The declaration of ``name``; ``KeyError`` for a name nobody declared."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not a declared setting (tideflow.settings_registry)") from None


def raw(name: str, environ: Environ = None) -> str | None:
    """The variable's text exactly as set, None when unset (its reader parses it)."""
    declared(name)
    return (os.environ if environ is None else environ).get(name)


def _given(name: str, environ: Environ) -> str | None:
    setting = declared(name)
    text = raw(name, environ)
    if text is not None and setting.blank_is_unset and not text.strip():
        return None
    return text


def text(name: str, environ: Environ = None, *, backend: str = "local") -> str:
    """The value (checked), or the default on ``backend``; "" when neither."""
    value = optional_text(name, environ, backend=backend)
    return "" if value is None else value


def optional_text(name: str, environ: Environ = None, *, backend: str = "local") -> str | None:
    """The value (checked), or the default on ``backend``; None when neither."""
    setting = declared(name)
    value = _given(name, environ)
    if value is None:
        return setting.default_for(backend)
    return setting.check(value)


def optional_number(name: str, environ: Environ = None, *, backend: str = "local") -> float | None:
    """The value as a number within its bounds, or the default; None when neither."""
    setting = declared(name)
    value = _given(name, environ)
    if value is None:
        value = setting.default_for(backend)
    return None if value is None else setting.number(value)


def number(name: str, environ: Environ = None, *, backend: str = "local") -> float:
    """Like ``optional_number``; an unset variable without a default is refused."""
    value = optional_number(name, environ, backend=backend)
    if value is None:
        raise declared(name).refuse(None)
    return value


def optional_whole(name: str, environ: Environ = None, *, backend: str = "local") -> int | None:
    value = optional_number(name, environ, backend=backend)
    return None if value is None else int(value)


def whole(name: str, environ: Environ = None, *, backend: str = "local") -> int:
    return int(number(name, environ, backend=backend))


def flag(name: str, environ: Environ = None) -> bool:
    """``1`` true, ``0`` false; unset (or blank, where that means unset): the default."""
    setting = declared(name)
    value = _given(name, environ)
    if value is None:
        value = setting.default_for() or "0"
    return FLAG_WORDS[setting.check(value)]


def optional_path(name: str, environ: Environ = None) -> Path | None:
    setting = declared(name)
    value = _given(name, environ)
    if value is None:
        value = setting.default_for()
    return None if value is None else setting.path(value)


def env_number(
    name: str,
    default: str | None,
    accepted: str,
    ok: Callable[[float], bool] = lambda _: True,
    *,
    whole: bool = False,
) -> float:
    """The declared variable ``name`` (``default`` when unset) as a finite number that
    ``ok`` accepts, a whole one when ``whole``; else ``ConfigError`` naming it. For
    the checks a declaration's bounds cannot say."""
    given = raw(name)
    text = given if given is not None else default
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (whole and not value.is_integer()) or not ok(value):
        raise bad_setting(name, given, accepted)
    return int(value) if whole else value


def check_set(reader: Reader, environ: Environ = None) -> None:
    """Check every setting ``reader`` reads that is set against its declaration (its
    kind, bounds and words; a form's own reader checks its form): a process calls it
    as it starts, so that a bad setting fails there, named, not later, deep inside."""
    for setting in SETTINGS:
        if reader in setting.readers and (value := _given(setting.name, environ)) is not None:
            setting.check(value)
