"""The local stack the stack tests and the browser test share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import running_stack


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The whole local stack as ``make demo`` starts it: S3, MLflow, Airflow's
    components, the lab's two teams and the broker. Started once for
    ``test_stack`` and ``test_browser``, which one worker runs one after the other
    (``tests.tiers.SHARED_STACK``), and stopped after them."""
    from tideflow.stack.team_story import BROKER_ENV

    yield from running_stack(tmp_path_factory.mktemp("stack"), BROKER_ENV)
