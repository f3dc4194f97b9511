"""Airflow's four components under one parent, as `airflow standalone` runs them, no log servers.

``python -m tideflow.stack.airflow_group AIRFLOW`` starts ``AIRFLOW api-server``,
``scheduler``, ``dag-processor`` and ``triggerer`` with the environment it was
given, prefixes each line they print with the component's name, and stops
them all when it is signalled or when one of them exits.

Why not `airflow standalone`: it starts the scheduler and the triggerer with
their log servers, and Airflow 3.3 binds those to every interface with no
setting to change it (``airflow/utils/serve_logs/core.py`` passes ``host=""``
to uvicorn; only ``[logging] worker_log_server_port`` and
``trigger_log_server_port`` are configurable). Here every component runs on
one machine and writes its logs under the same ``AIRFLOW_HOME``, where the API
server reads them, so the scheduler and triggerer run with
``--skip-serve-logs``. While a task is running or deferred, the API server
also tries the log server, finds none and notes "Could not read served logs"
among the log's source details; the log itself is read from the file.

This module starts programs; it does not import Airflow.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO

COMPONENTS: dict[str, tuple[str, ...]] = {
    "api-server": ("api-server",),
    "scheduler": ("scheduler", "--skip-serve-logs"),
    "dag-processor": ("dag-processor",),
    "triggerer": ("triggerer", "--skip-serve-logs"),
}
_PRINT = threading.Lock()

# Airflow's components share one SQLite file, one writer at a time. A
# writer waits up to this long for the lock (SQLite's default, 5 s, is shorter than
# a scheduler transaction on a busy machine). Airflow reads it through
# ``[database] sql_alchemy_connect_args`` (and ``_async``) and adds its own keys to it.
SQLITE_CONNECT_ARGS = {"timeout": 60}


def database_env(airflow_home: Path) -> dict[str, str]:
    """The stack's metadata database: SQLite in ``airflow_home``, named here so that an
    ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` of the user's (a production database) is
    not the local stack's, and waiting for its write lock as above."""
    here = f"{__name__}.SQLITE_CONNECT_ARGS"
    return {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home / 'airflow.db'}",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": here,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": here,
    }


def _relay(name: str, stream: IO[bytes]) -> None:
    for raw in stream:
        line = raw.decode(errors="replace").rstrip()
        with _PRINT:
            print(f"{name:13} | {line}", flush=True)


def _stop(processes: dict[str, subprocess.Popen[bytes]], grace_s: float = 20.0) -> None:
    for process in processes.values():
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes.values():
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: list[str]) -> int:
    airflow = argv[0] if argv else "airflow"
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    relays = []
    for name, args in COMPONENTS.items():
        process = subprocess.Popen(
            [airflow, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        processes[name] = process
        assert process.stdout is not None
        relay = threading.Thread(target=_relay, args=(name, process.stdout), daemon=True)
        relay.start()
        relays.append(relay)
    code = 0
    while not stopping.wait(0.5):
        ended = {name: p.returncode for name, p in processes.items() if p.poll() is not None}
        if ended:
            with _PRINT:
                print(f"airflow group | {ended} exited; stopping the others", flush=True)
            code = next(iter(ended.values())) or 1
            break
    _stop(processes)
    for relay in relays:
        relay.join(timeout=5)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
