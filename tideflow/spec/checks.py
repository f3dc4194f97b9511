"""Rules that span steps: names, ``needs``, cycles, template params, gang fit, gate metrics.

They run on the raw YAML data, so a graph problem is reported even when some
other field of the same step is also wrong.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from pydantic import ValidationError

from tideflow.spec.errors import SpecIssue
from tideflow.spec.report import did_you_mean
from tideflow.spec.step_kinds import DeviceClass, GangTraining
from tideflow.spec.yamlpos import Path, Positions, format_path


class ClusterCapacity(Protocol):
    """What the gang-fit check asks of a cluster; ``tideflow.inventory.Inventory`` answers it.

    The spec package sits below the inventory (which builds its cluster file on
    the spec's models and loader), so it names only the questions it asks.
    """

    @property
    def name(self) -> str: ...

    def max_gang_workers(
        self, device_class: DeviceClass, model: str | None, devices_per_worker: int
    ) -> int: ...

    def describe(self, device_class: DeviceClass, model: str | None) -> str: ...


_PARAM_REF = re.compile(r"params\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*['\"]([A-Za-z_]\w*)['\"]\s*\])")
_EXACT_PARAM = re.compile(r"^\s*\{\{\s*params\.([A-Za-z_]\w*)\s*\}\}\s*$")
# A gang command's args become '--KEY VALUE' options (tideflow.steps.commands.args_argv).
_OPTION_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class _Checker:
    def __init__(self, data: dict[str, Any], file: str, positions: Positions) -> None:
        self.data = data
        self.file = file
        self.positions = positions
        self.issues: list[SpecIssue] = []

    def add(self, path: Path, problem: str, accepted: str, *, key: bool = False) -> None:
        line, col = self.positions.of_key(path) if key else self.positions.of_value(path)
        self.issues.append(SpecIssue(self.file, line, col, format_path(path), problem, accepted))

    def steps(self) -> list[tuple[int, dict[str, Any]]]:
        steps = self.data.get("steps")
        if not isinstance(steps, list):
            return []
        return [(i, s) for i, s in enumerate(steps) if isinstance(s, dict)]

    def check_graph(self) -> None:
        names: dict[str, int] = {}
        for index, step in self.steps():
            name = step.get("name")
            if not isinstance(name, str):
                continue
            if name in names:
                self.add(
                    ("steps", index, "name"),
                    f"duplicate step name '{name}' (also steps[{names[name]}])",
                    "unique step names",
                )
            else:
                names[name] = index
        graph: dict[str, list[str]] = {}
        for index, step in self.steps():
            name = step.get("name")
            needs = step.get("needs", [])
            if not isinstance(name, str) or not isinstance(needs, list):
                continue
            graph.setdefault(name, [])
            for position, need in enumerate(needs):
                if not isinstance(need, str):
                    continue
                path: Path = ("steps", index, "needs", position)
                if need == name:
                    self.add(path, f"step '{name}' needs itself", "names of other steps")
                elif need not in names:
                    hint = did_you_mean(need, names)
                    self.add(path, f"unknown step '{need}'", f"{hint}steps are: {', '.join(names)}")
                else:
                    graph[name].append(need)
        self._check_cycles(graph, names)

    def _check_cycles(self, graph: dict[str, list[str]], names: dict[str, int]) -> None:
        state: dict[str, int] = {}  # 1 = on the current path, 2 = done
        reported: set[frozenset[str]] = set()

        def visit(node: str, trail: list[str]) -> None:
            state[node] = 1
            trail.append(node)
            for need in graph.get(node, []):
                if state.get(need) == 1:
                    cycle = [*trail[trail.index(need) :], need]
                    key = frozenset(cycle)
                    if key not in reported:
                        reported.add(key)
                        first = cycle[0]
                        self.add(
                            ("steps", names[first], "needs"),
                            "dependency cycle: " + " -> ".join(reversed(cycle)),
                            "steps must form a DAG; remove one of these needs",
                        )
                elif state.get(need) is None:
                    visit(need, trail)
            trail.pop()
            state[node] = 2

        for node in graph:
            if node not in state:
                visit(node, [])

    def check_param_refs(self) -> None:
        params = self.data.get("params")
        declared = set(params) if isinstance(params, dict) else set()
        for index, step in self.steps():
            self._walk_strings(step, ("steps", index), declared)

    def _walk_strings(self, value: Any, path: Path, declared: set[str]) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                self._walk_strings(item, (*path, key), declared)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                self._walk_strings(item, (*path, index), declared)
        elif isinstance(value, str) and "{{" in value:
            for match in _PARAM_REF.finditer(value):
                name = match.group(1) or match.group(2)
                if name not in declared:
                    hint = did_you_mean(name, declared)
                    known = ", ".join(sorted(declared)) or "none declared"
                    self.add(
                        path,
                        f"template refers to undeclared param '{name}'",
                        f"{hint}declared params: {known}",
                    )

    def check_gang_bodies(self) -> None:
        """Gang fields that depend on each other: a cpu gang's cores, a command's options."""
        for index, step in self.steps():
            block = step.get("gang_training")
            if not isinstance(block, dict):
                continue
            base: Path = ("steps", index, "gang_training")
            device = block.get("device")
            device_class = device.get("class", "cpu") if isinstance(device, dict) else "cpu"
            resources = block.get("resources")
            if (
                device_class == "cpu"
                and isinstance(resources, dict)
                and resources.get("cpu") is not None
            ):
                self.add(
                    (*base, "resources", "cpu"),
                    "a cpu gang's cores per worker are its devices_per_worker",
                    "devices_per_worker: N (cores per worker) and no resources.cpu; "
                    "resources.cpu is for gpu and npu gangs",
                )
            args = block.get("args")
            if isinstance(block.get("entrypoint"), list) and isinstance(args, dict):
                for key in args:
                    if not isinstance(key, str) or not _OPTION_KEY.match(key):
                        self.add(
                            (*base, "args", key),
                            f"args key {key!r} cannot be a command-line option "
                            "(a command's args are appended as --KEY VALUE)",
                            "keys of letters, digits, '_', '-' and '.', starting with a "
                            "letter or digit",
                            key=True,
                        )

    def nearest_upstream(self, index: int, kind: str) -> int | None:
        """The closest step of ``kind`` that step ``index`` needs, directly or through others.

        Breadth-first over ``needs``, as the compiler finds the step whose outputs
        a step reads (``tideflow.compile.dag_plan``).
        """
        by_name: dict[str, int] = {}
        for position, step in self.steps():
            name = step.get("name")
            if isinstance(name, str):
                by_name.setdefault(name, position)
        steps = dict(self.steps())
        frontier = list(_needs(steps[index]))
        seen: set[str] = set()
        while frontier:
            name = frontier.pop(0)
            if name in seen or name not in by_name:
                continue
            seen.add(name)
            upstream = steps[by_name[name]]
            if isinstance(upstream.get(kind), dict):
                return by_name[name]
            frontier.extend(_needs(upstream))
        return None

    def check_gate_metrics(self) -> None:
        """A promotion's gate names only metrics its upstream evaluation step declares.

        The gate reads the metrics of the nearest upstream evaluation step; a
        metric it does not declare would be missing at every run.
        """
        for index, step in self.steps():
            block = step.get("promote_checkpoint")
            gate = block.get("gate") if isinstance(block, dict) else None
            if not isinstance(gate, dict):
                continue
            source = self.nearest_upstream(index, "evaluation")
            if source is None:
                continue
            evaluation = self.data["steps"][source]
            declared = evaluation["evaluation"].get("metrics")
            if not isinstance(declared, list) or not all(isinstance(m, str) for m in declared):
                continue  # reported by the model validation
            base: Path = ("steps", index, "promote_checkpoint", "gate")
            where = f"evaluation step '{evaluation.get('name')}'"
            metric = gate.get("metric")
            if isinstance(metric, str) and "{{" not in metric and metric not in declared:
                self.add(
                    (*base, "metric"),
                    f"gate metric '{metric}' is not a metric of {where}, which the promotion reads",
                    f"{did_you_mean(metric, declared)}one of its declared metrics: "
                    f"{', '.join(declared)}",
                )
            thresholds = gate.get("thresholds")
            if not isinstance(thresholds, dict):
                continue
            for name in thresholds:
                if isinstance(name, str) and name not in declared:
                    self.add(
                        (*base, "thresholds", name),
                        f"threshold metric '{name}' is not a metric of {where}, which the "
                        "promotion reads",
                        f"{did_you_mean(name, declared)}one of its declared metrics: "
                        f"{', '.join(declared)}",
                        key=True,
                    )

    def resolve_default(self, value: Any) -> Any:
        """A templated field's value at the param's default, or None if not resolvable."""
        if isinstance(value, int):
            return value
        match = _EXACT_PARAM.match(value) if isinstance(value, str) else None
        params = self.data.get("params")
        if match and isinstance(params, dict):
            spec = params.get(match.group(1))
            if isinstance(spec, dict) and isinstance(spec.get("default"), int):
                return spec["default"]
        return None

    def check_team(self, inventory: ClusterCapacity) -> None:
        """With teams declared in the cluster file, the pipeline's team must be one of them,
        and its priority class one the team may use."""
        declared = getattr(inventory, "teams", None)  # tideflow.inventory.ClusterSpec or None
        meta = self.data.get("metadata")
        if not isinstance(meta, dict):
            return
        if declared is None:
            named = meta.get("priority_class")
            # A cluster file without teams has no classes: every run naming one would be
            # refused (tideflow.gangs.resolve_gang), so say so here, at the field.
            if isinstance(named, str) and hasattr(inventory, "teams"):
                self.add(
                    ("metadata", "priority_class"),
                    f"priority class '{named}' is named, but cluster file "
                    f"'{inventory.name}' declares no priority classes",
                    "no priority_class, or a cluster file with priority_classes and teams",
                )
            return
        teams = {team.name: team for team in declared.teams}
        team = meta.get("team")
        if teams and isinstance(team, str) and team not in teams:
            self.add(
                ("metadata", "team"),
                f"team '{team}' is not declared in cluster file '{inventory.name}'",
                f"{did_you_mean(team, list(teams))}one of {', '.join(sorted(teams))}",
            )
            return
        wanted = meta.get("priority_class")
        if not isinstance(wanted, str):
            return
        classes = [c.name for c in declared.priority_classes]
        allowed = teams[team].priority_classes if isinstance(team, str) and team in teams else None
        choices = list(allowed) if allowed is not None else classes
        if wanted not in choices:
            problem = (
                f"unknown priority class '{wanted}'"
                if wanted not in classes
                else f"team '{team}' may not use priority class '{wanted}'"
            )
            self.add(
                ("metadata", "priority_class"),
                problem,
                f"one of {', '.join(choices) or 'none (declare priority_classes)'}",
            )

    def check_gang_fit(self, inventory: ClusterCapacity) -> None:
        for index, step in self.steps():
            block = step.get("gang_training")
            if not isinstance(block, dict):
                continue
            try:
                gang = GangTraining.model_validate(block)
            except ValidationError:
                continue  # reported by the model validation
            workers = self.resolve_default(gang.workers)
            per_worker = self.resolve_default(gang.devices_per_worker)
            if not isinstance(workers, int) or not isinstance(per_worker, int):
                continue
            device_class = gang.device.device_class
            model = gang.device.model
            fit = inventory.max_gang_workers(device_class, model, per_worker)
            if workers <= fit:
                continue
            label = device_class if model is None else f"{model} {device_class}"
            self.add(
                ("steps", index, "gang_training", "workers"),
                f"{workers} workers x {per_worker} {label} can never be placed on cluster "
                f"'{inventory.name}' ({inventory.describe(device_class, model)}; "
                f"room for at most {fit} such workers)",
                f"workers <= {fit}, fewer devices_per_worker, or a larger cluster",
            )


def _needs(step: dict[str, Any]) -> list[str]:
    needs = step.get("needs")
    return [n for n in needs if isinstance(n, str)] if isinstance(needs, list) else []


def cross_step_issues(
    data: Any, file: str, positions: Positions, inventory: ClusterCapacity | None
) -> list[SpecIssue]:
    if not isinstance(data, dict):
        return []
    checker = _Checker(data, file, positions)
    checker.check_graph()
    checker.check_param_refs()
    checker.check_gang_bodies()
    checker.check_gate_metrics()
    if inventory is not None:
        checker.check_gang_fit(inventory)
        checker.check_team(inventory)
    return checker.issues
