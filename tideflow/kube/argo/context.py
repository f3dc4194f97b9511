"""What every part of the compiler shares: the pipeline, its tasks, the settings, the problems.

Problems are collected rather than raised, so one compile reports every field
that has no Argo form at once.
"""

from __future__ import annotations

from tideflow.compile.dag_plan import DagPlan, TaskPlan, compile_dag_plan
from tideflow.inventory import Inventory
from tideflow.kube.argo.parameters import ARGO_NAME
from tideflow.kube.settings import KubeSettings
from tideflow.spec.errors import SpecIssue
from tideflow.spec.models import PipelineSpec
from tideflow.spec.yamlpos import Path, Positions, format_path
from tideflow.steps.code import with_code_path
from tideflow.steps.context import pipeline_labels
from tideflow.steps.standalone_io import EVALUATION_OUTPUTS, GANG_OUTPUTS, PROMOTION_OUTPUTS


class CompileContext:
    def __init__(
        self,
        spec: PipelineSpec,
        settings: KubeSettings,
        inventory: Inventory | None,
        file: str,
        positions: Positions,
    ) -> None:
        self.spec = spec
        self.plan: DagPlan = compile_dag_plan(spec)
        self.tasks = {task.task_id: task for task in self.plan.tasks}
        self.settings = settings
        self.inventory = inventory
        self.file = file
        self.positions = positions
        self.issues: list[SpecIssue] = []

    def issue(self, path: Path, problem: str, accepted: str) -> None:
        line, column = self.positions.of_value(path)
        self.issues.append(SpecIssue(self.file, line, column, format_path(path), problem, accepted))

    def ancestors(self, task: TaskPlan) -> set[str]:
        found: set[str] = set()
        frontier = list(task.upstream)
        while frontier:
            name = frontier.pop()
            if name not in found:
                found.add(name)
                frontier.extend(self.tasks[name].upstream)
        return found

    def outputs_of(self, task: TaskPlan) -> tuple[str, ...]:
        """The step's output parameters on Argo."""
        if task.kind == "data_prep":
            return tuple(task.config["outputs"])
        if task.kind == "evaluation":
            metrics = [m for m in task.config["metrics"] if ARGO_NAME.match(m)]
            return tuple(dict.fromkeys((*EVALUATION_OUTPUTS, *metrics)))
        if task.kind == "promote_checkpoint":
            return PROMOTION_OUTPUTS
        if task.kind == "gang_training":
            return GANG_OUTPUTS
        return ()

    def code_env(self, env: dict[str, str]) -> dict[str, str]:
        """A user step's ``env`` with the image's copy of the pipeline's code
        (``code.image_path``) first on PYTHONPATH."""
        return with_code_path(env, self.plan.code_image_path, {})

    def index_of(self, name: str) -> int:
        return next(i for i, t in enumerate(self.plan.tasks) if t.task_id == name)

    def labels(self, task: TaskPlan) -> dict[str, str]:
        return pipeline_labels(self.plan.dag_id, self.plan.team, step=task.task_id)
