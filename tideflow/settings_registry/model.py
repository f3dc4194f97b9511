"""What a ``TIDEFLOW_*`` setting is: its declaration, and the checks its kind implies.

A declaration says everything a reader, a check and the reference table need: the
name, the kind of value and its bounds or words, the default (per backend where the
backends differ), who reads it and one line of help. The checks raise
``ConfigError`` naming the variable, the value and what is accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

Kind = Literal["text", "choice", "number", "whole", "flag", "path", "uri", "form"]
# Who reads a setting: a `tideflow` command, an Airflow operator at task start, the
# DAG file as Airflow parses it, a gang worker (the training runtime), the broker, or
# the local stack (`tideflow.stack`, `make demo`, `make cluster`).
Reader = Literal["cli", "operator", "dag", "worker", "broker", "stack"]
READERS: tuple[Reader, ...] = ("cli", "operator", "dag", "worker", "broker", "stack")
BACKENDS = ("local", "kubernetes")
FLAG_WORDS = {"1": True, "0": False}
STORE_SCHEMES = ("file", "s3")  # what a `uri` setting may name: the stores tideflow opens


class ConfigError(ValueError):
    """A setting that cannot be used: an environment variable, a cluster file, a flag,
    a server it names. Its message names the setting, the value and what is accepted;
    the CLI prints it and exits 2, never with a traceback (a ValueError still, so that
    callers catching those keep working)."""


def bad_setting(name: str, value: str | None, accepted: str, why: str = "") -> ConfigError:
    """``NAME='value': why; accepted: ...`` (``NAME (unset)`` when it is not set)."""
    shown = f"{name} (unset)" if value is None else f"{name}={value!r}"
    return ConfigError(f"{shown}: {why + '; ' if why else ''}accepted: {accepted}")


@dataclass(frozen=True)
class Setting:
    """One ``TIDEFLOW_*`` environment variable.

    ``default`` is the text used when it is unset (None: unset means "none", or a
    value derived as ``default_note`` says); ``kubernetes`` is the default where
    ``TIDEFLOW_BACKEND=kubernetes`` when it differs from ``default``. ``accepted`` is
    what a message says is accepted; the bounds and ``choices`` are what is checked.
    """

    name: str
    kind: Kind
    readers: tuple[Reader, ...]
    help: str
    accepted: str
    default: str | None = None
    kubernetes: str | None = None
    default_note: str = ""
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # inclusive
    above: float | None = None  # exclusive lower bound
    below: float | None = None  # exclusive upper bound
    blank_is_unset: bool = False  # an empty value means the same as an unset one
    nonblank: bool = False  # a name that must be given when set (a uri always must)
    backends: tuple[str, ...] = BACKENDS  # where it is read (TIDEFLOW_K8S_*: kubernetes)

    def default_for(self, backend: str = "local") -> str | None:
        """The text used when the variable is unset, on ``backend``."""
        if backend == "kubernetes" and self.kubernetes is not None:
            return self.kubernetes
        return self.default

    @property
    def defaults(self) -> dict[str, str]:
        """Each backend's default as the reference table shows it: the text used when
        unset, else the note that says what unset means; "(not read)" on a backend
        that does not read it."""
        return {
            b: (self.default_for(b) or self.default_note) if b in self.backends else "(not read)"
            for b in BACKENDS
        }

    def refuse(self, value: str | None, why: str = "") -> ConfigError:
        return bad_setting(self.name, value, self.accepted, why)

    def number(self, text: str) -> float:
        """``text`` as a finite number within the bounds (a whole one for ``whole``)."""
        try:
            value = float(text)
        except ValueError:
            raise self.refuse(text) from None
        if not math.isfinite(value) or (self.kind == "whole" and not value.is_integer()):
            raise self.refuse(text)
        if (
            (self.minimum is not None and value < self.minimum)
            or (self.above is not None and value <= self.above)
            or (self.below is not None and value >= self.below)
        ):
            raise self.refuse(text)
        return value

    def check(self, text: str) -> str:
        """``text`` when this setting accepts it, else ``ConfigError``."""
        if self.kind in ("number", "whole"):
            self.number(text)
        refused = (
            (self.kind == "choice" and text not in self.choices)
            or (self.kind == "flag" and text not in FLAG_WORDS)
            or (self.kind == "uri" and urlparse(text.strip()).scheme not in STORE_SCHEMES)
            or (self.nonblank and not text.strip())
        )
        if refused:
            raise self.refuse(text)
        if "\x00" in text:
            raise self.refuse(text, "a NUL character")
        return text

    def path(self, text: str) -> Path:
        self.check(text)
        return Path(text)
