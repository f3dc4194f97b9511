"""A setting an operator cannot use fails its task at start, as one message naming it.

Airflow logs a failed task's exception; the message is the setting's (its name, value
and what is accepted), and the failure is final: a retry would read the same setting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from airflow.sdk.exceptions import AirflowFailException

from tideflow import settings_registry as registry
from tideflow.config import ConfigError, Settings
from tideflow.operators.hook import TideflowHook


@contextlib.contextmanager
def settings_fail_the_task() -> Iterator[None]:
    """A ``ConfigError`` inside: ``AirflowFailException`` with its message alone."""
    try:
        yield
    except ConfigError as exc:
        raise AirflowFailException(str(exc)) from None


def check_settings_at_start(*more: Callable[[], object]) -> Settings:
    """The platform settings, every operator setting that is set checked against its
    declaration, and ``more`` checks; ``AirflowFailException`` with the message of the
    first one refused (its internals' traceback not chained: the message says it all)."""
    with settings_fail_the_task():
        registry.check_set("operator")
        settings = TideflowHook().settings()
        if settings.backend == "kubernetes":
            from tideflow.kube.settings import kube_settings_from_env

            kube_settings_from_env()
        for check in more:
            check()
    return settings
