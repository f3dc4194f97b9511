"""One identity of a step run: its gang id, key prefix, Kubernetes labels and workers'
environment all come from ``tideflow.steps.context`` (``StepRun`` and the functions
beside it), so the Argo Workflow, the gang objects, the broker's selectors and the
runtime that reads the environment agree on keys and on how values are made safe."""

from __future__ import annotations

import re
from pathlib import Path

from tideflow.steps.context import (
    GANG_ID_ENV,
    GANG_LABEL,
    PIPELINE_LABEL,
    RUN_LABEL,
    STEP_LABEL,
    TEAM_LABEL,
    StepRun,
    gang_labels,
    gang_selector,
    pipeline_labels,
)
from tideflow.storage.keys import dns_label

LABEL_VALUE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def test_a_step_runs_labels_name_its_pipeline_step_and_run() -> None:
    run = StepRun("digits", "manual__2026-11-23T12:00:00+00:00", "train")
    assert run.labels() == {
        PIPELINE_LABEL: "digits",
        STEP_LABEL: "train",
        RUN_LABEL: "manual-2026-11-23t12-00-00-00-00-bb78e66a",
    }
    assert list(run.labels()) == [PIPELINE_LABEL, STEP_LABEL, RUN_LABEL]


def test_a_gang_is_labelled_and_selected_by_the_same_value() -> None:
    run = StepRun("digits", "Weird//RUN id", "train")
    labels = gang_labels(run.gang_id, "Vision_Team")
    assert labels == {GANG_LABEL: dns_label(run.gang_id), TEAM_LABEL: dns_label("Vision_Team")}
    assert gang_selector(run.gang_id) == f"{GANG_LABEL}={labels[GANG_LABEL]}"
    assert all(LABEL_VALUE.fullmatch(v) for v in labels.values())


def test_pipeline_and_step_template_labels() -> None:
    assert pipeline_labels("digits", "vision") == {PIPELINE_LABEL: "digits", TEAM_LABEL: "vision"}
    labels = pipeline_labels("digits", "vision", step="prepare-data")
    assert list(labels.items()) == [
        (PIPELINE_LABEL, "digits"),
        (STEP_LABEL, "prepare-data"),
        (TEAM_LABEL, "vision"),
    ]


def test_the_workers_environment_names_the_run_as_the_runtime_reads_it() -> None:
    from tideflow.settings_registry.declared_worker import STEP_RUN_ENV

    env = StepRun("digits", "run-1", "train").env("vision")
    assert list(env) == list(STEP_RUN_ENV)
    assert env == {
        "TIDEFLOW_PIPELINE": "digits",
        "TIDEFLOW_TEAM": "vision",
        "TIDEFLOW_RUN_ID": "run-1",
        "TIDEFLOW_STEP": "train",
    }
    assert GANG_ID_ENV == "TIDEFLOW_GANG_ID"


def test_no_other_module_spells_a_step_run_label_or_env_name() -> None:
    """The keys are written once, in tideflow/steps/context.py (and the env names in
    the settings registry, which declares every TIDEFLOW_* setting)."""
    root = Path(__file__).resolve().parents[2]
    spelled = re.compile(
        r"[\"']tideflow\.io/(pipeline|team|run|step|gang)[\"']"
        r"|[\"']TIDEFLOW_(PIPELINE|TEAM|RUN_ID|STEP|GANG_ID)[\"']"
    )
    allowed = {
        Path("tideflow/steps/context.py"),
        Path("tideflow/settings_registry/declared_worker.py"),
    }
    found = [
        f"{path.relative_to(root)}:{n}"
        for folder in ("tideflow", "operators", "plugins")
        for path in sorted((root / folder).rglob("*.py"))
        if path.relative_to(root) not in allowed
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if spelled.search(line)
    ]
    assert found == []
