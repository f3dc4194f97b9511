"""The three servers of the local stack and how each is started.

Everything binds to 127.0.0.1. Ports are free ports picked at start and kept
in the stack's state file, so a second stack (a test's) can run beside the
developer's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tideflow.stack.processes import (
    StackError,
    free_port,
    free_port_pairs,
    start,
    tail,
    wait_http,
)

REPO = Path(__file__).resolve().parents[2]
BUCKETS = ("tideflow", "mlflow")
# The local S3 server runs without authentication; boto3 still wants some
# credentials to sign requests. These are placeholders, not secrets.
LOCAL_S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "tideflow-local",
    "AWS_SECRET_ACCESS_KEY": "tideflow-local",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class Service:
    name: str
    pid: int
    url: str
    log: str


@dataclass
class StackState:
    home: str
    services: dict[str, Service] = field(default_factory=dict)
    airflow_user: str = "admin"
    airflow_password: str = ""

    @property
    def path(self) -> Path:
        return Path(self.home) / "stack.json"

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = asdict(self)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, home: Path) -> StackState | None:
        try:
            data = json.loads((home / "stack.json").read_text())
        except FileNotFoundError:
            return None
        data["services"] = {k: Service(**v) for k, v in data["services"].items()}
        return cls(**data)

    def client_env(self) -> dict[str, str]:
        """Environment for clients of the stack: boto3, the MLflow client, tideflow."""
        env = dict(LOCAL_S3_CREDENTIALS)
        if "s3" in self.services:
            env["AWS_ENDPOINT_URL_S3"] = self.services["s3"].url
            env["MLFLOW_S3_ENDPOINT_URL"] = self.services["s3"].url
        if "mlflow" in self.services:
            env["MLFLOW_TRACKING_URI"] = self.services["mlflow"].url
        env["TIDEFLOW_HOME"] = self.home
        env["TIDEFLOW_ARTIFACT_ROOT"] = "s3://tideflow/artifacts"
        return env


def s3_client(state: StackState) -> Any:
    """A boto3 S3 client for the stack's SeaweedFS server."""
    import boto3

    env = state.client_env()
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL_S3"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )


def _bin(name: str) -> str:
    """A program installed next to this interpreter (the project's venv), else on PATH."""
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise StackError(f"'{name}' is not installed; run `make bootstrap`")
    return found


def start_s3(state: StackState) -> Service:
    """SeaweedFS in its all-in-one `mini` mode, every port on loopback."""
    home = Path(state.home)
    data = home / "s3"
    data.mkdir(parents=True, exist_ok=True)
    # Each server's gRPC port is its HTTP port + 10000 (some internal clients
    # assume so even when a gRPC port is given), hence pairs of free ports.
    flags = ("master.port", "volume.port", "filer.port", "s3.port", "admin.port", "webdav.port")
    ports = dict(zip(flags, free_port_pairs(len(flags)), strict=True))
    command = [
        _bin("weed"),
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-bucket={','.join(BUCKETS)}",
        *(f"-{flag}={port}" for flag, port in ports.items()),
    ]
    log = home / "logs" / "s3.log"
    pid = start(command, os.environ, log)
    url = f"http://127.0.0.1:{ports['s3.port']}"
    wait_http(
        f"{url}/", timeout_s=60, pgid=pid, log_path=log, name="SeaweedFS S3", ok_status=(200, 403)
    )
    _wait_buckets(url, pid, log)
    return Service("s3", pid, url, str(log))


def _wait_buckets(url: str, pid: int, log: Path) -> None:
    """`weed mini -bucket` creates buckets just after the S3 port opens; wait for them."""
    import time

    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=url,
        **{
            "aws_access_key_id": LOCAL_S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": LOCAL_S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "region_name": LOCAL_S3_CREDENTIALS["AWS_DEFAULT_REGION"],
        },
    )
    # Anonymous listings hide buckets here, so ask for each bucket directly.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        missing = []
        for bucket in BUCKETS:
            try:
                client.head_bucket(Bucket=bucket)
            except Exception:  # not created yet, or the server is still starting
                missing.append(bucket)
                with contextlib.suppress(Exception):
                    client.create_bucket(Bucket=bucket)
        if not missing:
            return
        time.sleep(0.5)
    raise StackError(f"S3 buckets {BUCKETS} not available; log:\n{tail(log)}")


def start_mlflow(state: StackState) -> Service:
    home = Path(state.home)
    port = free_port()
    s3 = state.services["s3"].url
    env = {
        **os.environ,
        **LOCAL_S3_CREDENTIALS,
        "MLFLOW_S3_ENDPOINT_URL": s3,
        "AWS_ENDPOINT_URL_S3": s3,
        # the job runner forks several processes we do not use (3 GB -> 0.5 GB)
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    command = [
        _bin("mlflow"),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{home / 'mlflow.db'}",
        "--artifacts-destination",
        "s3://mlflow/",
    ]
    log = home / "logs" / "mlflow.log"
    pid = start(command, env, log, cwd=home)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", timeout_s=120, pgid=pid, log_path=log, name="MLflow")
    return Service("mlflow", pid, url, str(log))


def airflow_env(state: StackState, port: int, dags_folder: Path, pipelines: Path) -> dict[str, str]:
    home = Path(state.home)
    airflow_home = home / "airflow"
    (home / "airflow-plugins").mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    return {
        **os.environ,
        **state.client_env(),
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "airflow-plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",  # the default forks 32 idle workers
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{state.airflow_user}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "airflow-passwords.json"),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "TIDEFLOW_PIPELINES_DIR": str(pipelines),
        # `airflow standalone` starts its components as `airflow ...` from PATH
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def _airflow_cli(env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        [_bin("airflow"), *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0:
        raise StackError(
            f"`airflow {' '.join(args)}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )


def start_airflow(
    state: StackState, *, dags_folder: Path, pipelines: Path, pools: dict[str, int]
) -> Service:
    home = Path(state.home)
    port = free_port()
    passwords = home / "airflow-passwords.json"
    if not passwords.exists():
        passwords.write_text(json.dumps({state.airflow_user: secrets.token_urlsafe(12)}))
        passwords.chmod(0o600)
    state.airflow_password = json.loads(passwords.read_text())[state.airflow_user]
    env = airflow_env(state, port, dags_folder, pipelines)
    _airflow_cli(env, "db", "migrate")
    pool_file = home / "pools.json"
    pool_file.write_text(
        json.dumps(
            {
                name: {
                    "slots": slots,
                    "description": "tideflow (sized from the cluster inventory)",
                    "include_deferred": False,
                }
                for name, slots in pools.items()
            }
        )
    )
    _airflow_cli(env, "pools", "import", str(pool_file))
    log = home / "logs" / "airflow.log"
    pid = start([_bin("airflow"), "standalone"], env, log, cwd=home)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/api/v2/monitor/health", timeout_s=180, pgid=pid, log_path=log, name="Airflow")
    return Service("airflow", pid, url, str(log))
