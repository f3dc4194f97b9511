"""Metrics to MLflow from rank 0, without ever blocking or failing training.

Records go to a queue that a background thread delivers in batches. While the
MLflow server is unreachable they wait, with backoff, and are also appended to
a spool file; whatever is still undelivered at the end stays in the spool, and
``tideflow.tracking.spool.flush_spool`` (called by the operator when the gang
finishes) delivers it.

Which run: the one the operator made (``MLFLOW_RUN_ID``). A gang started by
something that makes no run, an Argo Workflow's resource step, names its
pipeline run and step instead (``TIDEFLOW_PIPELINE``, ``TIDEFLOW_TEAM``,
``TIDEFLOW_RUN_ID``, ``TIDEFLOW_STEP``): rank 0 then finds or creates that
step's run under the pipeline run, as the standalone steps do, and ends it
when training ends.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from tideflow import settings_registry as registry
from tideflow.settings_registry.declared_worker import STEP_RUN_ENV
from tideflow.tracking.spool import deliver, spool_path

log = logging.getLogger("tideflow.runtime")


def _own_step_run() -> str | None:
    """The gang step's run, found by its tags or created, when the gang names its run."""
    pipeline, team, run_id, step = (registry.optional_text(name) for name in STEP_RUN_ENV)
    if not (pipeline and team and run_id and step):
        return None
    from tideflow.tracking import ensure_workflow_runs

    try:
        ids = ensure_workflow_runs(
            pipeline=pipeline, team=team, run_id=run_id, step=step, kind="gang_training"
        )
    except Exception as exc:  # training goes on untracked rather than not at all
        log.warning("tideflow: MLflow unreachable (%s); training runs untracked", exc)
        return None
    return ids.step_run_id


class MetricsLogger:
    def __init__(
        self,
        *,
        is_main: bool,
        run_id: str | None = None,
        retry_s: float = 2.0,
        max_retry_s: float = 60.0,
    ) -> None:
        self.run_id = run_id if run_id is not None else os.environ.get("MLFLOW_RUN_ID")
        # This logger retries on its own, with backoff; the client's own retries
        # would only hold a batch back for minutes while the server is down.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        tracking = bool(os.environ.get("MLFLOW_TRACKING_URI"))
        # Whether this logger found the run itself, and so ends it (see the module doc).
        self.owns_run = False
        if is_main and tracking and self.run_id is None:
            self.run_id = _own_step_run()
            self.owns_run = self.run_id is not None
        self.enabled = bool(is_main and self.run_id and tracking)
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self._queue: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, name="tideflow-metrics", daemon=True)
            self._thread.start()

    def _put(self, records: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._queue.extend(records)
        self._wake.set()

    def log_params(self, params: dict[str, Any]) -> None:
        self._put([{"kind": "param", "key": k, "value": v} for k, v in params.items()])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self._put(
            [
                {"kind": "metric", "key": k, "value": float(v), "step": step, "ts": now}
                for k, v in metrics.items()
            ]
        )

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._put([{"kind": "tag", "key": k, "value": v} for k, v in tags.items()])

    def log_checkpoint(self, manifest: Any) -> None:
        """Reference a committed checkpoint on the run (its files stay in the store)."""
        self.set_tags(
            {
                "tideflow.checkpoint.latest": manifest.uri,
                "tideflow.checkpoint.latest_sha256": manifest.checksum,
            }
        )
        self.log_metrics({"checkpoint_step": float(manifest.step)}, step=manifest.step)

    def _loop(self) -> None:
        delay = self.retry_s
        spooled = 0
        while True:
            self._wake.wait(timeout=delay)
            self._wake.clear()
            with self._lock:
                batch = list(self._queue)
            if batch:
                try:
                    assert self.run_id is not None
                    deliver(self.run_id, batch)
                except Exception as exc:
                    if spooled < len(batch):  # spool what is new since the last failure
                        path = spool_path(self.run_id or "unknown")
                        path.parent.mkdir(parents=True, exist_ok=True)
                        with open(path, "a", encoding="utf-8") as spool:
                            for record in batch[spooled:]:
                                spool.write(json.dumps(record) + "\n")
                        spooled = len(batch)
                    log.warning(
                        "tideflow: MLflow unreachable (%s); %d record(s) kept, retrying in %.0fs",
                        type(exc).__name__,
                        len(batch),
                        delay,
                    )
                    delay = min(delay * 2, self.max_retry_s)
                    if self._closing:
                        return
                    continue
                with self._lock:
                    del self._queue[: len(batch)]
                if spooled:
                    spool_path(self.run_id or "unknown").unlink(missing_ok=True)
                    spooled = 0
                delay = self.retry_s
            if self._closing and not self._queue:
                return

    def close(self, timeout_s: float = 30.0, *, succeeded: bool | None = None) -> None:
        """Deliver what is queued; then, for a run this logger found itself, end it.

        ``succeeded`` is how training ended: True or False ends the run FINISHED
        or FAILED; None (preempted, it will resume) leaves it running.
        """
        if self._thread is None:
            return
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=timeout_s)
        if self.owns_run and succeeded is not None and self.run_id is not None:
            from tideflow.tracking import finish_step_run_or_warn

            finish_step_run_or_warn(self.run_id, log.warning, succeeded=succeeded)
