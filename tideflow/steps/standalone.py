"""Run one pipeline step outside Airflow: what the containers of an Argo workflow run.

    python -m tideflow.steps.standalone KIND --pipeline P --team T --step S --run-id R
        [--attempt N] --config JSON [--set PATH:TYPE=VALUE ...] [--param NAME:TYPE=VALUE ...]
        [--device D] [--checkpoint-store URI] [--checkpoint-step N] [--training-step S]
        [--metrics JSON] [--checkpoint-selection JSON] --outputs DIR

KIND is ``data_prep``, ``evaluation``, ``promote_checkpoint``, or ``pipeline_end``
(the workflow's exit handler: it closes the parent MLflow run with the
workflow's status, given as ``--set status:str=...``). ``--config`` is
the step's configuration as JSON. Every value the workflow engine fills in when
the step runs comes as its own ``--set``: a path into the configuration (keys
and list indexes joined by '/', each URL-quoted), and how to read the text
(str, int, float, bool or json). So no filled-in value is ever escaped into
JSON, and a number reaches the entry point as a number, as Airflow's native
rendering gives it. ``--param`` gives the run's params (``ctx.params``) the same
way. Reading the arguments and writing the outputs: ``tideflow.steps.standalone_io``.

The work is the operators' own, from the core: the entry point runs in a child
process (``tideflow.steps.entrypoints``); an evaluation reads the checkpoint of
its gang step's store its ``checkpoint`` names (the best by the gang's
``keep_best``, or the latest: ``select_checkpoint``) and logs its metrics and
that choice to an MLflow run; a promotion goes through
``tideflow.promotion.promote`` with exactly the checkpoint that was evaluated.
Each output is written to DIR/NAME as text (JSON for mappings), where Argo
reads it as an output parameter. Exit codes: 0 done (a promotion the gate
rejects included), 1 the step failed (the reason is printed; a gate that reads
a metric the evaluation did not produce is one), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from tideflow.steps.context import StepContext
from tideflow.steps.entrypoints import StepError, declared_outputs, run_entrypoint
from tideflow.steps.evaluation import (
    DEFAULT_CHECKPOINT_CHOICE,
    SELECTION_OUTPUT,
    declared_metrics,
    entrypoint_args,
    find_checkpoint,
    select_checkpoint,
    selection_tags,
)
from tideflow.steps.standalone_io import (
    BAD_ARGUMENTS,
    EVALUATION_OUTPUTS,
    PROMOTION_OUTPUTS,
    build_parser,
    read_step,
    write_outputs,
)


def _say(line: str) -> None:
    print(line, flush=True)


class Step:
    """One step's run: its context, its MLflow run, its entry point."""

    def __init__(self, args: argparse.Namespace, config: dict[str, Any], params: dict[str, Any]):
        from tideflow.config import Settings

        self.args = args
        self.config = config
        self.params = params
        self.artifact_root = Settings.from_env().artifact_root

    def context(self, outputs: tuple[str, ...] = ()) -> StepContext:
        a = self.args
        return StepContext(
            pipeline=a.pipeline,
            team=a.team,
            step=a.step,
            dag_id=a.pipeline,
            run_id=a.run_id,
            try_number=a.attempt + 1,
            artifact_root=self.artifact_root,
            params=self.params,
            outputs=outputs,
        )

    def run(self, entrypoint: str | list[str], args: dict[str, Any]) -> dict[str, Any]:
        return run_entrypoint(
            self.context(), entrypoint, args, {}, step=self.args.step, on_line=_say
        )

    def track(self, *, required: bool = False) -> str | None:
        """The step's MLflow run (found again by tags on a retry), or None when untracked."""
        from tideflow.tracking import ensure_workflow_runs, tracking_enabled

        if not tracking_enabled():
            if required:
                raise StepError(
                    "tideflow: promotion needs the MLflow Model Registry; set MLFLOW_TRACKING_URI",
                    final=True,
                )
            return None
        a = self.args
        try:
            ids = ensure_workflow_runs(
                pipeline=a.pipeline,
                team=a.team,
                run_id=a.run_id,
                step=a.step,
                kind=a.kind,
                params=self.params,
            )
        except Exception as exc:
            if required:
                raise StepError(
                    f"tideflow: MLflow is unreachable; promotion needs it: {exc}"
                ) from exc
            _say(f"tideflow: MLflow is unreachable ({exc}); the step runs untracked")
            return None
        _say(f"tideflow: MLflow run {ids.step_run_id} (parent {ids.pipeline_run_id})")
        return ids.step_run_id

    @staticmethod
    def finish(
        run_id: str | None,
        *,
        succeeded: bool,
        tags: dict[str, str] | None = None,
        metrics: dict[str, float] | None = None,
    ) -> None:
        from tideflow.tracking import finish_step_run_or_warn

        finish_step_run_or_warn(run_id, _say, succeeded=succeeded, tags=tags, metrics=metrics)


def data_prep(step: Step) -> tuple[dict[str, Any], tuple[str, ...]]:
    config, name = step.config, step.args.step
    declared = tuple(config.get("outputs") or ())
    run_id = step.track()
    try:
        ctx = step.context(declared)
        raw = run_entrypoint(
            ctx, config["entrypoint"], config.get("args") or {}, {}, step=name, on_line=_say
        )
        outputs = declared_outputs(name, config["entrypoint"], declared, raw)
    except BaseException:
        step.finish(run_id, succeeded=False)
        raise
    step.finish(
        run_id,
        succeeded=True,
        tags={f"tideflow.output.{key}": uri for key, uri in outputs.items()},
    )
    for key, uri in sorted(outputs.items()):
        _say(f"tideflow: output {key} = {uri}")
    return outputs, declared


def evaluation(step: Step) -> tuple[dict[str, Any], tuple[str, ...]]:
    config, a = step.config, step.args
    selection = None
    if a.checkpoint_store:
        selection = select_checkpoint(
            a.checkpoint_store,
            str(config.get("checkpoint") or DEFAULT_CHECKPOINT_CHOICE),
            config.get("keep_best"),
            log=_say,
        )
    checkpoint = selection.facts if selection is not None else {}
    if checkpoint:
        _say(f"tideflow: evaluating checkpoint {checkpoint['checkpoint']}")
    device = a.device or "cpu"
    run_id = step.track()
    try:
        returned = step.run(
            config["entrypoint"], entrypoint_args(checkpoint, config.get("args") or {})
        )
        metrics = declared_metrics(a.step, config["entrypoint"], config["metrics"], returned)
    except BaseException:
        step.finish(run_id, succeeded=False, tags={"tideflow.device": device})
        raise
    step.finish(
        run_id,
        succeeded=True,
        metrics=metrics,
        tags={
            "tideflow.device": device,
            "tideflow.checkpoint": str(checkpoint.get("checkpoint", "")),
            **(selection.tags() if selection is not None else {}),
        },
    )
    for key, value in metrics.items():
        _say(f"tideflow: {key} = {value:.4f}")
    outputs = {"metrics": metrics, "device": device, **checkpoint, **metrics}
    if selection is not None:
        outputs[SELECTION_OUTPUT] = selection.record()
    return outputs, (*EVALUATION_OUTPUTS, *metrics)


def promote_checkpoint(step: Step) -> tuple[dict[str, Any], tuple[str, ...]]:
    from tideflow.promotion import registry
    from tideflow.promotion.promote import PromotionError, PromotionRequest, promote, whoami

    config, a = step.config, step.args
    try:
        metrics = {k: float(v) for k, v in json.loads(a.metrics or "{}").items()}
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise StepError(
            f"step '{a.step}': --metrics is not a JSON object of numbers: {exc}"
        ) from exc
    try:
        selection = selection_tags(json.loads(a.checkpoint_selection or "{}"))
    except json.JSONDecodeError as exc:
        raise StepError(
            f"step '{a.step}': --checkpoint-selection is not a JSON object: {exc}"
        ) from exc
    if not a.checkpoint_store:
        raise StepError(f"step '{a.step}' has no checkpoint store to promote from", final=True)
    at = int(a.checkpoint_step) if a.checkpoint_step not in (None, "") else None
    trained = find_checkpoint(a.checkpoint_store, at)
    run_id = step.track(required=True)
    assert run_id is not None
    request = PromotionRequest(
        step=a.step,
        model=config["model"],
        alias=config.get("alias") or "champion",
        gate=config["gate"],
        metrics=metrics,
        trained=trained,
        run_id=run_id,
        who=f"{whoami()} via Argo {a.pipeline}/{a.run_id}/{a.step}",
        artifact_root=step.artifact_root,
        builder=config.get("builder"),
        builder_args=config.get("args") or {},
        lineage={
            "tideflow.pipeline": a.pipeline,
            "tideflow.dag_id": a.pipeline,
            "tideflow.dag_run_id": a.run_id,
            "tideflow.training_task": a.training_step or "",
        },
        selection=selection,
    )
    try:
        result = promote(registry.client(), request, step.run, _say)
    except PromotionError as exc:
        if exc.final:  # misconfigured: nothing a retry can change; the run says why
            step.finish(
                run_id,
                succeeded=False,
                tags={"tideflow.decision": "failed", "tideflow.reason": str(exc)[:4900]},
            )
        raise StepError(str(exc), final=exc.final) from exc
    if result.run_tags is not None:
        step.finish(run_id, succeeded=True, tags=result.run_tags)
    return result.outputs, PROMOTION_OUTPUTS


def pipeline_end(step: Step) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The workflow's exit handler: close its parent MLflow run with the workflow's status.

    Never fails the workflow over MLflow: a run left open is logged, not raised.
    """
    from tideflow.tracking import finish_pipeline_run, tracking_enabled

    a = step.args
    status = str(step.config.get("status", ""))
    if not tracking_enabled():
        return {}, ()
    try:
        closed = finish_pipeline_run(
            pipeline=a.pipeline,
            dag_id=a.pipeline,
            dag_run_id=a.run_id,
            succeeded=status == "Succeeded",
        )
    except Exception as exc:
        _say(f"tideflow: could not close the pipeline's MLflow run: {exc}")
        return {}, ()
    if closed:
        _say(f"tideflow: pipeline run {a.run_id} closed on MLflow ({status or 'unknown'})")
    return {}, ()


RUNNERS: dict[str, Callable[[Step], tuple[dict[str, Any], tuple[str, ...]]]] = {
    "data_prep": data_prep,
    "evaluation": evaluation,
    "promote_checkpoint": promote_checkpoint,
    "pipeline_end": pipeline_end,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config, params = read_step(args)
    except BAD_ARGUMENTS as exc:
        print(f"tideflow: step '{args.step}': bad arguments: {exc}", file=sys.stderr)
        return 2
    try:
        outputs, names = RUNNERS[args.kind](Step(args, config, params))
    except StepError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    write_outputs(args.outputs, outputs, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
