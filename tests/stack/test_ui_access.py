"""Who sees what on the tideflow page, through Airflow's real API app.

Airflow's own FastAPI app (``create_app``, with the tideflow plugin mounted
under ``/tideflow``) runs in-process behind Starlette's test client, with a
test auth manager that really has per-DAG rights (``tests/ui_auth.py``: the
simple auth manager has none). Two tideflow DAGs are serialized into the
tests' Airflow DB by ``airflow dags reserialize``: ``ui-open`` (team vision)
and ``ui-secret`` (team secret-team). The user ``reader`` may not read
``ui-secret`` nor see the broker; ``admin`` may do everything.

The data is real: a real MLflow server (SQLite, artifacts in a real SeaweedFS)
holds the registered models, a real lease ledger holds the leases, a real
decision journal holds the broker's decisions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.stack.test_ui_page import XSS

pytestmark = [pytest.mark.processes, pytest.mark.servers]

OPEN, SECRET = "ui-open", "ui-secret"  # DAG ids; tests/ui_auth.py denies SECRET to reader
PASSWORDS = {"admin": "admin-test-password", "reader": "reader-test-password"}
JWT_SECRET = "tideflow-ui-access-test-jwt-secret-" + "x" * 40  # this throw-away app only
CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: lab}
nodes:
  - {name: h100, count: 2, cpu: 64, accelerators: {class: gpu, model: H100, count: 8}}
teams:
  - name: vision
    quota: [{device: gpu, nominal: 6, budget_device_hours: 100}]
  - name: secret-team
    quota: [{device: gpu, nominal: 4}]
"""

OPEN_MODEL, SECRET_MODEL, UNLINKED_MODEL = "ui-open-model", "ui-secret-model", "unlinked-model"
QUOTE_MODEL = "it's-a-model"
BOTH_QUOTES_MODEL = 'say "it\'s" model'  # no MLflow search filter can name it
SECRET_CHECKPOINT = "s3://secret-bucket/ui-secret/SECRET-CKPT/MANIFEST.json"
SECRET_METRIC = "secret_recall"
SECRET_RUN = "manual__secret-run"
LEASE_OPEN = f"{OPEN}/manual__open-2/train"
LEASE_SECRET = f"{SECRET}/{SECRET_RUN}/train"
LEASE_INFERENCE = "broker/inference/0"
LEASE_LOOSE = "hand-made-gang"  # not a DAG's gang, not the broker's: nobody's to see
BROKER_REASON = "forecast wants 8 GPUs (test decision)"

# the ones without '/' or ':' can be MLflow model names
XSS_MODEL_NAMES = tuple(p for p in XSS if "/" not in p and ":" not in p)


@dataclass
class Page:
    client: Any
    tokens: dict[str, str]

    def get(self, path: str, user: str | None = None, headers: dict[str, str] | None = None) -> Any:
        self.client.cookies.clear()  # every request carries only what it is given
        sent = dict(headers or {})
        if user:
            sent["Authorization"] = f"Bearer {self.tokens[user]}"
        return self.client.get(path, headers=sent, follow_redirects=False)

    def overview(self, user: str) -> dict[str, Any]:
        answer = self.get("/tideflow/api/overview", user)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def html(self, user: str) -> str:
        answer = self.get("/tideflow/", user)
        assert answer.status_code == 200, answer.text
        return str(answer.text)


def _pipelines(repo: Path, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    source = (repo / "pipelines" / "digits.yaml").read_text()
    for dag_id, team in ((OPEN, "vision"), (SECRET, "secret-team")):
        text = source.replace("  name: digits\n", f"  name: {dag_id}\n", 1)
        text = text.replace("  team: vision\n", f"  team: {team}\n", 1)
        assert f"name: {dag_id}" in text and f"team: {team}" in text
        (directory / f"{dag_id}.yaml").write_text(text)
    return directory


def _serialize_dags() -> None:
    """Airflow's own `dags reserialize`: the DAGs land in the DB as a DAG processor writes them."""
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run(
        [str(airflow), "dags", "reserialize"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _register(client: Any, name: str, *tag_sets: dict[str, str]) -> None:
    """A registered model with one version per tag set; the last one is the champion."""
    client.create_registered_model(name)
    version = None
    for tags in tag_sets:
        version = client.create_model_version(name, source="s3://mlflow/models/test", tags=tags)
    assert version is not None
    client.set_registered_model_alias(name, "champion", version.version)
    if len(tag_sets) > 1:
        client.set_registered_model_alias(name, "previous-champion", str(int(version.version) - 1))


def _lineage(dag_id: str, run_id: str, checkpoint: str, **metrics: str) -> dict[str, str]:
    return {
        "tideflow.dag_id": dag_id,
        "tideflow.dag_run_id": run_id,
        "tideflow.checkpoint": checkpoint,
        **{f"tideflow.metric.{k}": v for k, v in metrics.items()},
    }


def _seed_mlflow(url: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(url)
    _register(
        client,
        OPEN_MODEL,
        _lineage(OPEN, "manual__open-1", "s3://tideflow/open/1/MANIFEST.json", accuracy="0.91"),
        _lineage(OPEN, "manual__open-2", "s3://tideflow/open/2/MANIFEST.json", accuracy="0.95"),
    )
    _register(
        client, SECRET_MODEL, _lineage(SECRET, SECRET_RUN, SECRET_CHECKPOINT, secret_recall="0.77")
    )
    _register(client, UNLINKED_MODEL, {"tideflow.checkpoint": "s3://elsewhere/UNLINKED-CKPT"})
    _register(client, QUOTE_MODEL, _lineage(OPEN, "manual__quote", "s3://tideflow/quote"))
    _register(client, BOTH_QUOTES_MODEL, _lineage(OPEN, "manual__both", "s3://tideflow/both"))
    others = [p for p in XSS if p not in XSS_MODEL_NAMES]  # as run ids, checkpoints, metrics
    for i, name in enumerate(XSS_MODEL_NAMES):
        run_id, checkpoint, metric = others[i], others[i + 3], others[(i + 6) % len(others)]
        _register(client, name, _lineage(OPEN, run_id, checkpoint, accuracy=metric))


def _seed_ledger_and_journal(home: Path, cluster: Path) -> None:
    from tideflow.broker.journal import DecisionJournal
    from tideflow.broker.policy import Action, BrokerDecision
    from tideflow.gangs import open_ledger
    from tideflow.scheduling import GangRequest, Lease

    ledger = open_ledger(home / "leases.db", str(cluster))
    for request in (
        GangRequest(LEASE_OPEN, "vision", "gpu", None, 1, 2),
        GangRequest(LEASE_SECRET, "secret-team", "gpu", None, 1, 2),
        GangRequest(LEASE_INFERENCE, "inference", "gpu", None, 1, 8, 1_000_000, False),
        GangRequest(LEASE_LOOSE, "vision", "gpu", None, 1, 1),
        GangRequest(f"{OPEN}/manual__xss/evaluate", XSS[0], "gpu", None, 1, 1),
    ):
        assert isinstance(ledger.try_acquire(request, "test", 3600), Lease), request
    DecisionJournal(home / "broker.db").record(
        time.time() - 300,
        BrokerDecision(Action.GROW, 8, 6, 8, reason=BROKER_REASON),
        total_gpus=16,
        measured_rps=60.0,
        forecast_upper=80.0,
    )


@pytest.fixture(scope="module")
def page(
    airflow_home: Path, mlflow_url: str, repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Page]:
    root = tmp_path_factory.mktemp("ui-access")
    home = root / "tideflow"
    cluster = root / "cluster.yaml"
    cluster.write_text(CLUSTER)
    passwords = root / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TIDEFLOW_PIPELINES_DIR", str(_pipelines(repo, root / "pipelines")))
        env.setenv("TIDEFLOW_HOME", str(home))
        env.setenv("TIDEFLOW_CLUSTER_FILE", str(cluster))
        env.setenv("MLFLOW_TRACKING_URI", mlflow_url)
        _serialize_dags()
        _seed_mlflow(mlflow_url)
        _seed_ledger_and_journal(home, cluster)
        env.setenv("AIRFLOW__CORE__AUTH_MANAGER", "tests.ui_auth.DagRightsTestAuthManager")
        env.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:ADMIN,reader:VIEWER")
        env.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
        env.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
        env.setenv("AIRFLOW__API_AUTH__JWT_SECRET", JWT_SECRET)
        from airflow.api_fastapi.app import create_app, purge_cached_app
        from fastapi.testclient import TestClient

        purge_cached_app()  # no auth manager left over from another test module
        try:
            with TestClient(create_app()) as client:
                tokens = {}
                for user, password in PASSWORDS.items():
                    answer = client.post(
                        "/auth/token", json={"username": user, "password": password}
                    )
                    assert answer.status_code == 201, answer.text
                    tokens[user] = answer.json()["access_token"]
                yield Page(client, tokens)
        finally:
            purge_cached_app()


# -- per-DAG rights ------------------------------------------------------------------------


def test_airflows_own_api_refuses_the_reader_the_denied_dag(page: Page) -> None:
    assert page.get(f"/api/v2/dags/{SECRET}", "reader").status_code == 403
    assert page.get(f"/api/v2/dags/{OPEN}", "reader").status_code == 200
    assert page.get(f"/api/v2/dags/{SECRET}", "admin").status_code == 200
    listed = page.get("/api/v2/dags", "reader").json()
    assert OPEN in {d["dag_id"] for d in listed["dags"]}
    assert SECRET not in {d["dag_id"] for d in listed["dags"]}


def test_overview_hides_champion_lease_and_usage_of_a_dag_the_user_may_not_read(
    page: Page,
) -> None:
    overview = page.overview("reader")
    text = json.dumps(overview)
    for secret in (SECRET, SECRET_MODEL, SECRET_CHECKPOINT, SECRET_METRIC, "secret-team"):
        assert secret not in text, secret
    assert [p["dag_id"] for p in overview["pipelines"] if p["dag_id"].startswith("ui-")] == [OPEN]
    models = {c["model"] for c in overview["champions"]}
    assert OPEN_MODEL in models  # the readable DAG's champion is there ...
    assert SECRET_MODEL not in models  # ... the denied DAG's is not
    # The MLflow server is the session's: other modules' champions may be there too.
    assert {c["dag_id"] for c in overview["champions"] if c["dag_id"].startswith("ui-")} == {OPEN}
    leases = {lease["gang_id"] for lease in overview["leases"]}
    assert LEASE_OPEN in leases and LEASE_SECRET not in leases
    assert {u["team"] for u in overview["usage"]} == {"vision"}
    assert overview["teams_declared"] is True
    assert [(t["team"], t["nominal"], t["in_use"]) for t in overview["teams"]] == [
        ("vision", 6, 3)  # LEASE_OPEN and LEASE_LOOSE
    ]


def test_page_hides_champion_lease_and_usage_of_a_dag_the_user_may_not_read(page: Page) -> None:
    html = page.html("reader")
    for secret in (SECRET, SECRET_MODEL, SECRET_CHECKPOINT, SECRET_METRIC, "secret-team"):
        assert secret not in html, secret
    assert OPEN_MODEL in html and LEASE_OPEN in html and "<td>vision</td>" in html
    assert '<section id="teams">' in html and '<section id="queue">' in html


def test_admin_sees_every_dags_champion_lease_usage_and_the_broker(page: Page) -> None:
    overview = page.overview("admin")
    models = {c["model"] for c in overview["champions"]}
    assert {OPEN_MODEL, SECRET_MODEL} <= models
    leases = {lease["gang_id"] for lease in overview["leases"]}
    assert {LEASE_OPEN, LEASE_SECRET, LEASE_INFERENCE} <= leases
    assert {"vision", "secret-team", "inference"} <= {u["team"] for u in overview["usage"]}
    assert [(t["team"], t["in_use"]) for t in overview["teams"]] == [
        ("secret-team", 2),
        ("vision", 3),
    ]
    assert [p["reason"] for p in overview["broker"]] == [BROKER_REASON]
    html = page.html("admin")
    assert SECRET_CHECKPOINT in html and BROKER_REASON in html and "<svg" in html


def test_the_broker_is_shown_only_to_users_allowed_the_tideflow_broker_view(page: Page) -> None:
    overview = page.overview("reader")
    assert overview["broker"] == [] and overview["broker_window"] is None
    assert overview["broker_shown"] is False
    assert LEASE_INFERENCE not in {lease["gang_id"] for lease in overview["leases"]}
    assert "inference" not in {u["team"] for u in overview["usage"]}
    html = page.html("reader")
    assert BROKER_REASON not in html and "<svg" not in html
    assert "No broker is configured" not in html  # it is there, just not for this user
    assert page.overview("admin")["broker_shown"] is True


def test_champions_and_leases_tied_to_no_dag_are_shown_to_nobody(page: Page) -> None:
    for user in ("admin", "reader"):
        overview = page.overview(user)
        assert UNLINKED_MODEL not in {c["model"] for c in overview["champions"]}
        assert LEASE_LOOSE not in {lease["gang_id"] for lease in overview["leases"]}
        assert "UNLINKED-CKPT" not in page.html(user)


# -- odd model names -----------------------------------------------------------------------


def test_a_model_named_with_a_quote_shows_beside_the_others(page: Page) -> None:
    overview = page.overview("reader")
    champions = {c["model"]: c for c in overview["champions"]}
    assert QUOTE_MODEL in champions and OPEN_MODEL in champions, overview["problems"]
    assert champions[QUOTE_MODEL]["versions"] == 1
    assert champions[OPEN_MODEL]["versions"] == 2
    assert champions[OPEN_MODEL]["previous_version"] == "1"
    assert not [p for p in overview["problems"] if "MLflow could not be read" in p]
    assert "it&#x27;s-a-model" in page.html("reader")


def test_a_champion_that_cannot_be_read_is_reported_and_the_others_show(page: Page) -> None:
    overview = page.overview("reader")
    models = {c["model"] for c in overview["champions"]}
    assert BOTH_QUOTES_MODEL not in models and {OPEN_MODEL, QUOTE_MODEL} <= models
    (problem,) = [p for p in overview["problems"] if BOTH_QUOTES_MODEL in p]
    assert "could not be read" in problem


# -- authentication ------------------------------------------------------------------------


def _token(secret: str, valid_for: float, algorithm: str | None = None) -> str:
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    claims = {"sub": "admin", "role": "ADMIN", "teams": []}
    if algorithm == "none":
        import jwt

        now = int(time.time())
        claims.update({"aud": "apache-airflow", "iat": now, "nbf": now, "exp": now + 3600})
        return str(jwt.encode(claims, None, algorithm="none"))
    return str(
        JWTGenerator(secret_key=secret, valid_for=valid_for, audience="apache-airflow").generate(
            claims
        )
    )


PROBES: dict[str, Any] = {
    "no credentials": lambda: {},
    "empty bearer": lambda: {"Authorization": "Bearer "},
    "bearer none": lambda: {"Authorization": "Bearer none"},
    "garbage bearer": lambda: {"Authorization": "Bearer not.a.jwt"},
    "token signed with another key": lambda: {
        "Authorization": f"Bearer {_token('another-secret-' + 'y' * 60, 3600)}"
    },
    "expired token": lambda: {"Authorization": f"Bearer {_token(JWT_SECRET, -3600)}"},
    "unsigned token (alg none)": lambda: {
        "Authorization": f"Bearer {_token(JWT_SECRET, 3600, 'none')}"
    },
    "garbage session cookie": lambda: {"Cookie": "_token=not.a.jwt"},
    "expired session cookie": lambda: {"Cookie": f"_token={_token(JWT_SECRET, -3600)}"},
}
ROUTES = ("/tideflow/", "/tideflow/api/overview")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("probe", sorted(PROBES))
def test_page_refuses_callers_without_a_valid_session(page: Page, route: str, probe: str) -> None:
    answer = page.get(route, headers=PROBES[probe]())
    if answer.status_code == 303:  # a browser is sent to log in (the HTML route only)
        assert route == "/tideflow/"
        assert answer.headers["location"].startswith("/auth/login?next=")
    else:
        assert answer.status_code in (401, 403), (answer.status_code, answer.text)
    for data in (OPEN, OPEN_MODEL, LEASE_OPEN, "vision"):
        assert data not in answer.text


def test_the_probes_tokens_are_well_formed_a_valid_one_is_let_in(page: Page) -> None:
    """The forged tokens differ from a good one only in what the probe names."""
    good = {"Authorization": f"Bearer {_token(JWT_SECRET, 3600)}"}
    assert page.get("/tideflow/api/overview", headers=good).status_code == 200
    expired = page.get("/tideflow/api/overview", headers=PROBES["expired token"]())
    assert (expired.status_code, expired.json()["detail"]) == (401, "Token Expired")


# -- escaping ------------------------------------------------------------------------------


def test_text_from_mlflow_and_the_ledger_comes_out_escaped(page: Page) -> None:
    """Ten payloads as model names, DAG run ids, checkpoints, metric values and a lease's team.

    (MLflow refuses '/' and ':' in model names and '<' in tag keys, so metric
    names and some payloads cannot get there; tests/stack/test_ui_page.py puts all
    ten into every field of the rendered page.)
    """
    from html import escape
    from html.parser import HTMLParser

    html = page.html("admin")
    assert len(XSS_MODEL_NAMES) == 3
    for payload in XSS:
        assert payload not in html, payload
        assert escape(payload) in html, payload  # shown, as text

    class Elements(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.found: list[tuple[str, dict[str, str | None]]] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.found.append((tag, dict(attrs)))

    parser = Elements()
    parser.feed(html)
    assert not [tag for tag, _ in parser.found if tag in ("script", "img", "iframe")]
    assert not [name for _, attrs in parser.found for name in attrs if name.startswith("on")]
    hrefs = [attrs.get("href") or "" for _, attrs in parser.found]
    assert not [href for href in hrefs if href.lower().startswith("javascript:")]
