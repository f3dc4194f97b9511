"""Run a child process in its own process group and stream its output line by line."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence


class StreamedProcess:
    """A child whose merged stdout/stderr is passed to ``on_line`` as it arrives."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str], cwd: str | None = None):
        self.command = list(command)
        # A new session so that stop() reaches grandchildren too (a shell
        # command may spawn more processes), and Ctrl-C in a terminal
        # running `tideflow run` is handled by us, not sent to the child twice.
        self.process = subprocess.Popen(
            self.command,
            env=dict(env),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
            bufsize=1,
            errors="replace",
        )
        self.tail: collections.deque[str] = collections.deque(maxlen=30)

    def stream(self, on_line: Callable[[str], None]) -> int:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            text = line.rstrip("\n")
            self.tail.append(text)
            on_line(text)
        return self.process.wait()

    def stop(self, grace_seconds: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass
