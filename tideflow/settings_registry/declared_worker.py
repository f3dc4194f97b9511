"""What a step's processes are told: set by operators and backends, read by workers.

Operators and backends write these into a worker's environment (a user never sets
them); the training runtime and step commands read them.
"""

from __future__ import annotations

from tideflow.settings_registry.model import Kind, Setting

# A step run in its gang workers' environment, in this order: pipeline, team, run, step
# (written by tideflow.steps.context.StepRun.env, read by tideflow.runtime.metrics).
STEP_RUN_ENV = ("TIDEFLOW_PIPELINE", "TIDEFLOW_TEAM", "TIDEFLOW_RUN_ID", "TIDEFLOW_STEP")


def _worker(name: str, kind: Kind, help_: str, accepted: str, **kw: object) -> Setting:
    kw.setdefault("default_note", "set for each worker by its backend")
    return Setting(name, kind, ("worker",), help_, accepted, **kw)  # type: ignore[arg-type]


WORKER = (
    _worker(
        "TIDEFLOW_CHECKPOINT_URI",
        "uri",
        "The gang step's checkpoint store (unset: no checkpoints, start at step 0).",
        "a store URI",
        blank_is_unset=True,
        default_note="none",
    ),
    _worker(
        "TIDEFLOW_CHECKPOINT_EVERY_STEPS",
        "whole",
        "Checkpoint every N steps (the step's checkpoint.every_steps).",
        "a whole number >= 1",
        minimum=1,
        blank_is_unset=True,
        default_note="none",
    ),
    _worker(
        "TIDEFLOW_CHECKPOINT_EVERY_SECONDS",
        "whole",
        "Checkpoint every N seconds (the step's checkpoint.every_seconds).",
        "a whole number >= 1",
        minimum=1,
        blank_is_unset=True,
        default_note="none",
    ),
    _worker(
        "TIDEFLOW_KEEP_LAST",
        "whole",
        "Checkpoints kept, newest first (checkpoint.keep_last).",
        "a whole number >= 1",
        default="3",
        minimum=1,
        blank_is_unset=True,
    ),
    _worker(
        "TIDEFLOW_KEEP_BEST_METRIC",
        "text",
        "The metric whose best checkpoint is kept too (checkpoint.keep_best.metric).",
        "a metric name",
        blank_is_unset=True,
        default_note="none",
    ),
    _worker(
        "TIDEFLOW_KEEP_BEST_MODE",
        "choice",
        "Whether the best is the highest or the lowest metric.",
        "max, min",
        default="max",
        choices=("max", "min"),
    ),
    _worker(
        "TIDEFLOW_DEVICE_CLASS",
        "text",
        "The device class the step was placed on (a class this machine lacks: emulated).",
        "a device class (cpu, gpu, npu, ...)",
        default="cpu",
    ),
    _worker(
        "TIDEFLOW_EMULATED",
        "flag",
        "1: run on the CPU in place of the class.",
        "1, 0",
        default="0",
        blank_is_unset=True,
    ),
    _worker(
        "TIDEFLOW_RESTART_COUNT",
        "whole",
        "How many times the gang was restarted.",
        "a whole number >= 0",
        default="0",
        minimum=0,
        blank_is_unset=True,
    ),
    _worker(
        "TIDEFLOW_MIN_WORKERS",
        "whole",
        "An elastic gang's fewest workers (resuming on another size is then allowed).",
        "a whole number >= 1",
        minimum=1,
        blank_is_unset=True,
        default_note="none: not elastic",
    ),
    _worker("TIDEFLOW_GANG_ID", "text", "The gang's id.", "a gang id"),
    _worker("TIDEFLOW_ATTEMPT_ID", "text", "The attempt a commit receipt names.", "an attempt id"),
    _worker(
        "TIDEFLOW_PROGRESS_FILE",
        "path",
        "Where the runtime records the step it last reached (for the supervisor).",
        "a file path",
    ),
    _worker(
        "TIDEFLOW_HANG_TIMEOUT_S",
        "number",
        "Seconds without progress after which a worker calls itself hung (exit 77).",
        "seconds > 0",
        above=0,
        blank_is_unset=True,
        default_note="none: no watchdog",
    ),
    _worker("TIDEFLOW_PIPELINE", "text", "The pipeline, for the step's MLflow run.", "a name"),
    _worker("TIDEFLOW_TEAM", "text", "The team, for the step's MLflow run.", "a name"),
    _worker("TIDEFLOW_RUN_ID", "text", "The DAG run, for the step's MLflow run.", "a run id"),
    _worker("TIDEFLOW_STEP", "text", "The step, for the step's MLflow run.", "a step name"),
    _worker(
        "TIDEFLOW_STEP_CONTEXT", "path", "The step context file (JSON) a command reads.", "a file"
    ),
    _worker("TIDEFLOW_STEP_ARGS", "path", "The step's args file (JSON).", "a file"),
    _worker(
        "TIDEFLOW_STEP_OUTPUTS",
        "path",
        "Where a command writes its outputs (JSON; {rank} is the rank).",
        "a file path",
    ),
)
