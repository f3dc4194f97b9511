"""Start servers in their own process groups, wait until they answer, stop whole groups."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path


class StackError(RuntimeError):
    """A server of the local stack failed to start or to answer."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_pairs(count: int, offset: int = 10000) -> list[int]:
    """``count`` free ports P whose P + offset are free too, no two of them colliding.

    SeaweedFS puts each server's gRPC port at its HTTP port + 10000 and refuses
    an HTTP port that another server's gRPC port would take.
    """
    chosen: list[int] = []
    taken: set[int] = set()
    for _ in range(500):
        port = free_port()
        pair = {port, port + offset}
        if port + offset > 65535 or pair & taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + offset))
            except OSError:
                continue
        chosen.append(port)
        taken |= pair | {port - offset}
        if len(chosen) == count:
            return chosen
    raise StackError("no free pairs of ports found on 127.0.0.1")


def start(
    command: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path | None = None
) -> int:
    """Start ``command`` as the leader of a new session; output goes to ``log_path``.

    A new session matters: Airflow's components and `mlflow server` fork
    workers that ignore their parent's SIGTERM, so stopping means signalling
    the whole process group.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            list(command),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process.pid


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie leader with no other members counts as gone
    try:
        state = Path(f"/proc/{pgid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return _any_member(pgid)
    return state != "Z" or _any_member(pgid)


def _any_member(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == pgid:
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_group(pgid: int, grace_s: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pgid, os.WNOHANG)
        if not group_alive(pgid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, 0)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_http(
    url: str,
    *,
    timeout_s: float,
    pgid: int,
    log_path: Path,
    name: str,
    ok_status: tuple[int, ...] = (200,),
    context: ssl.SSLContext | None = None,
) -> None:
    """Poll ``url`` until it answers; fail early, with the log's tail, if the server died.

    On failure the server's process group is stopped: a half-started server
    must not linger with ports and files held.
    """
    try:
        _wait_http(
            url,
            timeout_s=timeout_s,
            pgid=pgid,
            log_path=log_path,
            name=name,
            ok_status=ok_status,
            context=context,
        )
    except StackError:
        stop_group(pgid, grace_s=5)
        raise


def _wait_http(
    url: str,
    *,
    timeout_s: float,
    pgid: int,
    log_path: Path,
    name: str,
    ok_status: tuple[int, ...],
    context: ssl.SSLContext | None,
) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            raise StackError(
                f"{name} exited during start-up; last log lines of {log_path}:\n{tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                if response.status in ok_status:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            if exc.code in ok_status:
                return
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.5)
    raise StackError(
        f"{name} did not answer {url} within {timeout_s:.0f}s ({last}); last log "
        f"lines of {log_path}:\n{tail(log_path)}"
    )
