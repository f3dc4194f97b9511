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
way.

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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from tideflow.steps.context import StepContext
from tideflow.steps.entrypoints import StepError, declared_outputs, run_entrypoint
from tideflow.steps.evaluation import (
    CHECKPOINT_KEYS,
    DEFAULT_CHECKPOINT_CHOICE,
    SELECTION_OUTPUT,
    declared_metrics,
    entrypoint_args,
    find_checkpoint,
    select_checkpoint,
    selection_tags,
)

KINDS = ("data_prep", "evaluation", "promote_checkpoint", "pipeline_end")
EVALUATION_OUTPUTS = ("metrics", "device", *CHECKPOINT_KEYS, SELECTION_OUTPUT)
PROMOTION_OUTPUTS = ("decision", "version", "alias", "previous", "reason", "model_uri")
# The Argo gang step's (tideflow.gangs.driver): where the gang kept its checkpoints, its newest.
GANG_OUTPUTS = ("checkpoint_store", "checkpoint", "checkpoint_step")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def read_value(text: str, kind: str) -> Any:
    """``text`` as the type the compiler recorded for it."""
    if kind == "str":
        return text
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"{text!r} is not a boolean (true or false)")
    if kind == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    raise ValueError(f"unknown value type {kind!r}: accepted: str, int, float, bool, json")


def parse_assignment(item: str) -> tuple[list[str], Any]:
    """``PATH:TYPE=VALUE`` -> (path segments, typed value)."""
    target, equals, text = item.partition("=")
    path, colon, kind = target.rpartition(":")
    if not equals or not colon or not path:
        raise ValueError(f"{item!r} is not PATH:TYPE=VALUE")
    return [unquote(part) for part in path.split("/")], read_value(text, kind)


def assign(doc: Any, path: list[str], value: Any) -> None:
    for part in path[:-1]:
        doc = doc[int(part)] if isinstance(doc, list) else doc.setdefault(part, {})
    last = path[-1]
    if isinstance(doc, list):
        doc[int(last)] = value
    else:
        doc[last] = value


def output_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list, bool)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def write_outputs(directory: Path, outputs: Mapping[str, object], names: tuple[str, ...]) -> None:
    """One file per name; a name with no value gets an empty file, so Argo finds them all."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text(output_text(outputs.get(name)), encoding="utf-8")


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


def build_parser(
    kinds: tuple[str, ...] = KINDS, prog: str = "python -m tideflow.steps.standalone"
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run one pipeline step outside Airflow (an Argo workflow's step container).",
    )
    parser.add_argument("kind", choices=kinds)
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--team", required=True)
    parser.add_argument("--step", required=True)
    parser.add_argument("--run-id", required=True, help="the workflow run (its name)")
    parser.add_argument("--attempt", type=int, default=0, help="0 for the first try")
    parser.add_argument("--config", required=True, help="the step's configuration as JSON")
    parser.add_argument("--set", action="append", default=[], metavar="PATH:TYPE=VALUE")
    parser.add_argument("--param", action="append", default=[], metavar="NAME:TYPE=VALUE")
    parser.add_argument("--device", help="evaluation: where the pod was placed (cpu, gpu-spare...)")
    parser.add_argument("--checkpoint-store", help="the gang step's checkpoint store URI")
    parser.add_argument("--checkpoint-step", help="promotion: the evaluated checkpoint's step")
    parser.add_argument("--training-step", help="promotion: the gang step's name (lineage)")
    parser.add_argument("--metrics", help="promotion: the evaluation's metrics as JSON")
    parser.add_argument(
        "--checkpoint-selection",
        help="promotion: how the evaluation chose its checkpoint (its output, JSON)",
    )
    parser.add_argument("--outputs", required=True, type=Path, help="directory for output files")
    return parser


def read_step(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The step's configuration with every ``--set`` filled in, and the run's params.

    ValueError (or KeyError, IndexError, TypeError) for arguments that do not fit.
    """
    config = json.loads(args.config)
    if not isinstance(config, dict):
        raise ValueError("--config is not a JSON object")
    for item in args.set:
        path, value = parse_assignment(item)
        assign(config, path, value)
    params = {}
    for item in args.param:
        (name, *_), value = parse_assignment(item)
        params[name] = value
    return config, params


BAD_ARGUMENTS = (ValueError, KeyError, IndexError, TypeError)


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
