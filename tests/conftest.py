"""Shared test setup.

Airflow reads its configuration when first imported, so the environment of a
private, throw-away Airflow home is set here, at import time, before any test
module imports Airflow. Nothing in the developer's own Airflow home is touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.tiers"]  # the unit/processes/servers/... markers

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
_SCRATCH = Path(tempfile.mkdtemp(prefix="tideflow-tests-"))

os.environ.update(
    {
        "AIRFLOW_HOME": str(_SCRATCH / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(_SCRATCH / "airflow" / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "TIDEFLOW_HOME": str(_SCRATCH / "tideflow"),
        "TIDEFLOW_ARTIFACT_ROOT": (_SCRATCH / "artifacts").as_uri(),
        "TIDEFLOW_PIPELINES_DIR": str(REPO / "pipelines"),
        # Steps track into a throw-away SQLite MLflow store (registry included)
        "MLFLOW_TRACKING_URI": f"sqlite:///{_SCRATCH / 'mlflow.db'}",
    }
)
os.environ.pop("TIDEFLOW_CLUSTER_FILE", None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_SCRATCH, ignore_errors=True)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@contextlib.contextmanager
def made_once(factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """A directory of this run, ``name``, and whether the caller is to fill it: the
    first test worker to ask fills it (True) while the others wait, and they then
    find it filled (False). For deterministic results that tests of several modules
    compare against (the digits reference run): one run of it, not one per module."""
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's, shared by its workers
    directory, done = root / f"once-{name}", root / f"once-{name}.done"
    with open(root / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            yield directory, False
            return
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        yield directory, True
        done.touch()


@pytest.fixture(scope="session")
def migrated_airflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Airflow metadata DB as a real ``airflow db migrate`` leaves it, made once per
    test run: the Airflow homes of the tests start from a copy, as a user's second run
    does, so a test pays for what it does with Airflow, not for a migration (5 CPU-s,
    and up to 30 s on a busy machine, per home)."""
    from tideflow.dag.local_run import prepare_home

    with made_once(tmp_path_factory, "airflow-db") as (home, fill):
        if fill:
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("AIRFLOW_HOME", str(home))
                patch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(home / "dags"))
                prepare_home(home)
    return home / "airflow.db"


def airflow_home_from(migrated_db: Path, home: Path) -> Path:
    """``home`` with a copy of ``migrated_db`` as its metadata DB, unless it has one."""
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "airflow.db").exists():
        shutil.copy(migrated_db, home / "airflow.db")
    return home


@pytest.fixture(scope="session")
def airflow_home(migrated_airflow_db: Path) -> Iterator[Path]:
    """A migrated SQLite metadata DB and the tideflow loader in the DAG folder."""
    from tideflow.dag.local_run import prepare_home

    home = airflow_home_from(migrated_airflow_db, Path(os.environ["AIRFLOW_HOME"]))
    prepare_home(home)
    yield home


@pytest.fixture
def artifact_root() -> Path:
    return Path(os.environ["TIDEFLOW_ARTIFACT_ROOT"].removeprefix("file://"))


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real SeaweedFS S3 server on 127.0.0.1 (buckets: tideflow, mlflow), for this session.

    boto3 is pointed at it through its own environment variables, as users do,
    with the credentials the server generated (it refuses anonymous requests).
    """
    from tideflow.stack.processes import stop_group
    from tideflow.stack.services import StackState, start_s3

    state = StackState(str(tmp_path_factory.mktemp("s3")))
    service = start_s3(state)
    state.services["s3"] = service
    env = state.client_env()
    exported = {
        key: env[key]
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    exported["AWS_ENDPOINT_URL_S3"] = service.url
    previous = {k: os.environ.get(k) for k in exported}
    os.environ.update(exported)
    try:
        yield service.url
    finally:
        stop_group(service.pid)
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def mlflow_url(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow server (the stack's own start_mlflow) on the session's SeaweedFS,
    started once: each module names its experiments and models apart from the others'."""
    from tideflow.stack.processes import stop_group
    from tideflow.stack.services import Service, StackState, start_mlflow

    state = StackState(
        str(tmp_path_factory.mktemp("mlflow")), services={"s3": Service("s3", 0, s3_endpoint, "")}
    )
    service = start_mlflow(state)
    try:
        yield service.url
    finally:
        stop_group(service.pid)


def running_stack(home: Path, env: dict[str, str] | None = None) -> Iterator[Any]:
    """The whole local stack started under ``home`` (its servers see ``env`` too; this
    process's environment is restored once they are up), then every process group it
    started stopped, and checked to be gone."""
    from tideflow.stack.__main__ import down, up
    from tideflow.stack.processes import group_alive
    from tideflow.stack.services import StackState

    saved = {name: os.environ.get(name) for name in env or {}}

    def restore() -> None:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    os.environ.update(env or {})
    try:
        state = up(home)
        restore()
        yield state
    finally:
        restore()
        pids = [s.pid for s in (StackState.load(home) or StackState(str(home))).services.values()]
        down(home)
        assert not [pid for pid in pids if group_alive(pid)], "a server outlived `down`"
