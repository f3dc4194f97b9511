"""A small client for the Airflow 3 REST API (the parts the demo and the tests use)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any


class AirflowApiError(RuntimeError):
    pass


class AirflowApi:
    def __init__(self, base_url: str, username: str, password: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.username = username
        self.password = password
        self._token: str | None = None

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        auth: bool = True,
        ok: tuple[int, ...] = (200, 201),
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if auth:
            request.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read().decode()
                status = response.status
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            status = exc.code
        if status not in ok:
            raise AirflowApiError(f"{method} {path} -> HTTP {status}: {text[:2000]}")
        return json.loads(text) if text else None

    def token(self) -> str:
        if self._token is None:
            answer = self._request(
                "POST",
                "/auth/token",
                {"username": self.username, "password": self.password},
                auth=False,
            )
            self._token = str(answer["access_token"])
        return self._token

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        try:
            return dict(self._request("GET", f"/api/v2/dags/{dag_id}"))
        except AirflowApiError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def wait_for_dag(self, dag_id: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.dag(dag_id)
            if found is not None:
                return found
            time.sleep(2)
        errors = self.import_errors()
        detail = "\n".join(f"{e['filename']}: {e['stack_trace']}" for e in errors)
        raise AirflowApiError(
            f"DAG {dag_id} was not parsed within {timeout_s:.0f}s"
            + (f"; import errors:\n{detail}" if detail else "")
        )

    def import_errors(self) -> list[dict[str, Any]]:
        return list(self._request("GET", "/api/v2/importErrors")["import_errors"])

    def unpause(self, dag_id: str) -> None:
        self._request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        # Airflow 3 requires logical_date to be present (null = "now, no interval")
        run = self._request(
            "POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}}
        )
        return str(run["dag_run_id"])

    def clear_task(self, dag_id: str, run_id: str, task_id: str) -> None:
        """Run one task of a finished DAG run again (as "Clear" in the UI does)."""
        self._request(
            "POST",
            f"/api/v2/dags/{dag_id}/clearTaskInstances",
            {
                "dry_run": False,
                "dag_run_id": run_id,
                "task_ids": [task_id],
                "only_failed": False,
                "reset_dag_runs": True,
            },
        )

    def run_state(self, dag_id: str, run_id: str) -> str:
        run = self._request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        return str(run["state"])

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        answer = self._request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {ti["task_id"]: str(ti["state"]) for ti in answer["task_instances"]}

    def dag_runs(self, dag_id: str, limit: int = 100) -> list[dict[str, Any]]:
        answer = self._request(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns?limit={limit}&order_by=-run_after"
        )
        return list(answer["dag_runs"])

    def extra_links(self, dag_id: str, run_id: str, task_id: str) -> dict[str, str | None]:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/links"
        return dict(self._request("GET", path)["extra_links"])

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> list[str]:
        """The events of one try's log, as the UI shows them (the source details first)."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        answer = self._request("GET", f"{path}?full_content=true")
        return [str(line.get("event", "")) for line in answer["content"]]

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(3)
        raise AirflowApiError(f"run {run_id} of {dag_id} did not finish in {timeout_s:.0f}s")
