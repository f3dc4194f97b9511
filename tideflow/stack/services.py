"""The three servers of the local stack and how each is started.

Everything listens on 127.0.0.1 only. Ports are free ports picked at start and
kept in the stack's state file, so a second stack (a test's) can run beside
the developer's own.

The stack's home directory is the user's alone (0700) and every file in it
that holds a secret is written 0600 from its first byte: the state file (the
Airflow password), Airflow's passwords file and the S3 server's identities
(an access key and secret generated per home). The S3 server refuses
anonymous requests; MLflow has no login locally (it is bound to loopback and
refuses foreign Host headers and cross-site writes).
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

from tideflow.stack.airflow_group import database_env
from tideflow.stack.processes import (
    StackError,
    free_port,
    free_port_pairs,
    start,
    stop_group,
    tail,
    wait_http,
)

REPO = Path(__file__).resolve().parents[2]
BUCKETS = ("tideflow", "mlflow")
S3_REGION = "us-east-1"
# SeaweedFS's S3 identities (its -s3.config format), generated once per stack home
S3_IDENTITIES = "s3-identities.json"
AIRFLOW_PASSWORDS = "airflow-passwords.json"
_GROUP = "tideflow.stack.airflow_group"  # Airflow's components, run as one program


def private_dir(path: Path) -> Path:
    """Create ``path`` if needed and take group and other access away from it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        path.chmod(mode & 0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable and writable by the user only.

    The temporary file is created with mode 0600 (set again with fchmod, so the
    umask cannot change it) before any byte is written, then renamed over
    ``path``: readers see the old file or the new one, whole, and no byte of
    it is ever open to others.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def s3_credentials(home: Path) -> dict[str, str] | None:
    """The stack's S3 access key and secret as boto3's variables; None before they exist."""
    try:
        identities = json.loads((home / S3_IDENTITIES).read_text())
    except FileNotFoundError:
        return None
    credential = identities["identities"][0]["credentials"][0]
    return {
        "AWS_ACCESS_KEY_ID": str(credential["accessKey"]),
        "AWS_SECRET_ACCESS_KEY": str(credential["secretKey"]),
    }


def ensure_s3_credentials(home: Path) -> Path:
    """The S3 server's identities file, generated (0600) the first time; its path."""
    path = home / S3_IDENTITIES
    if path.exists():
        path.chmod(0o600)  # a file from an older stack
        return path
    identities = {
        "identities": [
            {
                "name": "tideflow",
                "credentials": [
                    {
                        "accessKey": "TF" + secrets.token_hex(9).upper(),
                        "secretKey": secrets.token_urlsafe(30),
                    }
                ],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }
    write_private(path, json.dumps(identities, indent=2))
    return path


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
        """Write the state file (it holds the Airflow password): 0600, atomically."""
        write_private(self.path, json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, home: Path) -> StackState | None:
        try:
            data = json.loads((home / "stack.json").read_text())
        except FileNotFoundError:
            return None
        data["services"] = {k: Service(**v) for k, v in data["services"].items()}
        return cls(**data)

    def s3_credentials(self) -> dict[str, str] | None:
        return s3_credentials(Path(self.home))

    def client_env(self) -> dict[str, str]:
        """Environment for clients of the stack: boto3, the MLflow client, tideflow.

        The S3 credentials are the ones generated for this home. A state whose
        home holds none (an MLflow server started on another home's S3 server)
        leaves them out: its clients take them from their own environment.
        """
        env = {"AWS_DEFAULT_REGION": S3_REGION, **(self.s3_credentials() or {})}
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
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
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
    """SeaweedFS in its all-in-one `mini` mode: every port on loopback, S3 with credentials.

    S3 requests must be signed with the home's generated credentials. The
    filer's and volume server's HTTP ports, which would take writes past S3,
    require JWTs signed with keys made for this start (SeaweedFS reads them
    from WEED_JWT_* variables); the S3 gateway signs its own requests. The
    WebDAV gateway (anonymous), the admin UI, the Iceberg and Lance ports (fixed
    defaults) and telemetry are off. What stays open on loopback: the gRPC
    ports and the master's HTTP API (SeaweedFS guards them only with mutual
    TLS or an IP allow-list).
    """
    home = private_dir(Path(state.home))
    data = home / "s3"
    data.mkdir(parents=True, exist_ok=True)
    identities = ensure_s3_credentials(home)
    # Each server's gRPC port is its HTTP port + 10000 (some internal clients
    # assume so even when a gRPC port is given), hence pairs of free ports.
    flags = ("master.port", "volume.port", "filer.port", "s3.port", "admin.port")
    ports = dict(zip(flags, free_port_pairs(len(flags)), strict=True))
    command = [
        _bin("weed"),
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-bucket={','.join(BUCKETS)}",
        *(f"-{flag}={port}" for flag, port in ports.items()),
        f"-s3.config={identities}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        "-master.telemetry=false",
    ]
    env = {
        **os.environ,
        "WEED_JWT_SIGNING_KEY": secrets.token_urlsafe(32),
        "WEED_JWT_FILER_SIGNING_KEY": secrets.token_urlsafe(32),
        "WEED_JWT_FILER_SIGNING_READ_KEY": secrets.token_urlsafe(32),
    }
    log = home / "logs" / "s3.log"
    # run in its data folder: SeaweedFS reads ./security.toml, if any, from there
    pid = start(command, env, log, cwd=data)
    url = f"http://127.0.0.1:{ports['s3.port']}"
    wait_http(
        f"{url}/", timeout_s=60, pgid=pid, log_path=log, name="SeaweedFS S3", ok_status=(200, 403)
    )
    try:
        _wait_buckets(url, state, log)
    except StackError:
        stop_group(pid, grace_s=5)
        raise
    return Service("s3", pid, url, str(log))


def _wait_buckets(url: str, state: StackState, log: Path) -> None:
    """`weed mini -bucket` creates buckets just after the S3 port opens; wait for them."""
    import time

    import boto3

    env = state.client_env()
    client = boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    # Ask for each bucket directly (a listing can lag behind).
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
    """MLflow on 127.0.0.1, artifacts proxied to the stack's S3 (no login: see the module doc)."""
    home = private_dir(Path(state.home))
    port = free_port()
    s3 = state.services["s3"].url
    env = {
        **os.environ,
        "AWS_DEFAULT_REGION": S3_REGION,
        **(state.s3_credentials() or {}),  # the artifact proxy signs its S3 requests
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
    # The log servers are not started (see tideflow.stack.airflow_group); their
    # ports are still the stack's own, so the API server never asks another
    # Airflow's log server on this machine for a log.
    worker_logs, trigger_logs = free_port(), free_port()
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
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / AIRFLOW_PASSWORDS),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        **database_env(airflow_home),
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": "127.0.0.1",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_logs),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_logs),
        "TIDEFLOW_PIPELINES_DIR": str(pipelines),
        # the components are started as `airflow ...` from PATH
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
    home = private_dir(Path(state.home))
    port = free_port()
    passwords = home / AIRFLOW_PASSWORDS
    if passwords.exists():
        passwords.chmod(0o600)  # a file from an older stack
    else:
        write_private(passwords, json.dumps({state.airflow_user: secrets.token_urlsafe(12)}))
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
    command = [sys.executable, "-m", _GROUP, _bin("airflow")]
    pid = start(command, env, log, cwd=home)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/api/v2/monitor/health", timeout_s=180, pgid=pid, log_path=log, name="Airflow")
    return Service("airflow", pid, url, str(log))
