"""Build one DAG per pipeline file; report broken files as Airflow import errors.

Airflow records import errors per Python file, and an exception in the loader
would hide every pipeline. So the loader catches each pipeline's problems and
files them as import errors under the YAML file's own path: one broken
pipeline shows up in the UI and in ``airflow dags list-import-errors`` with its
file and line, and the others still load.

Every pipeline comes from the one DAG file, so a task process, which parses
that file to find its DAG, would also build and report every other pipeline.
Airflow tells a parse that is for one DAG (``get_parsing_context().dag_id``,
set by the task runner and ``airflow dags/tasks test``): such a parse builds
that DAG only and reports only the problems of files that declare its name, so
a task of pipeline A never shows pipeline B's errors. The DAG processor's
parse has no such context and reports every broken file.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tideflow import settings_registry as registry
from tideflow.compile.dag_plan import compile_dag_plan
from tideflow.config import ConfigError, Settings
from tideflow.inventory import Inventory, load_cluster
from tideflow.spec import SpecError, SpecIssue, find_pipelines, load_pipeline
from tideflow.spec.yamlpos import LIMITS, load_yaml

log = logging.getLogger(__name__)


class PipelineImportWarning(UserWarning):
    """Carries a pipeline's errors when no Airflow import-error channel is reachable."""


@dataclass
class LoadResult:
    dags: dict[str, Any] = field(default_factory=dict)
    errors: dict[Path, SpecError] = field(default_factory=dict)
    # The pipeline name each file declares, where it can be read (broken files too).
    names: dict[Path, str] = field(default_factory=dict)

    def errors_for(self, dag_id: str) -> dict[Path, SpecError]:
        """The problems that concern pipeline ``dag_id``: those of files declaring its name,
        and, when it was not built, those of files whose name cannot be read."""
        return {
            path: error
            for path, error in self.errors.items()
            if self.names.get(path) == dag_id
            or (path not in self.names and dag_id not in self.dags)
        }


def _declared_name(path: Path) -> str | None:
    """``metadata.name`` as a file writes it, valid or not (None if it cannot be read)."""
    try:
        if path.stat().st_size > LIMITS.max_bytes:
            return None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    data = load_yaml(text, str(path)).data  # within the same limits as the spec loader
    metadata = data.get("metadata") if isinstance(data, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else None


def load_dags(
    pipelines_dir: Path, inventory: Inventory | None = None, *, only: str | None = None
) -> LoadResult:
    """A DAG per valid pipeline file under ``pipelines_dir``, and each other file's problems.

    With ``only``, every file is still read (a name is only known from the file),
    but only the DAG of that name is built.
    """
    from tideflow.dag.builder import build_dag

    result = LoadResult()
    owners: dict[str, Path] = {}
    roots = Settings.from_env().checkpoint_roots_for
    for path in find_pipelines(pipelines_dir):
        try:
            spec = load_pipeline(path, inventory, roots)
            name = spec.metadata.name
            result.names[path] = name
            if name in owners:
                raise SpecError(
                    str(path),
                    [
                        SpecIssue(
                            str(path),
                            1,
                            1,
                            "metadata.name",
                            f"pipeline name '{name}' is already used by {owners[name]}",
                            "a name unique across the pipelines directory",
                        )
                    ],
                )
            owners[name] = path
            if only is None or name == only:
                result.dags[name] = build_dag(compile_dag_plan(spec), path)
        except SpecError as exc:
            result.errors[path] = exc
            if path not in result.names and (declared := _declared_name(path)) is not None:
                result.names[path] = declared
        except Exception as exc:  # an unexpected failure still must not hide other pipelines
            log.exception("tideflow: failed to build a DAG from %s", path)
            result.errors[path] = SpecError(
                str(path),
                [
                    SpecIssue(
                        str(path),
                        1,
                        1,
                        "",
                        f"internal error while building the DAG: {exc!r}",
                        "please report this with the pipeline file",
                    )
                ],
            )
    return result


def _airflow_import_result() -> tuple[Any, Path | None] | None:
    """The ``DagImportResult`` of the Airflow importer that is executing us, if any."""
    try:
        from airflow.dag_processing.importers.base import DagImportResult
    except ImportError:
        return None
    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("result")
        if isinstance(candidate, DagImportResult):
            bundle = frame.f_locals.get("bundle_path")
            return candidate, Path(bundle) if bundle else None
        frame = frame.f_back
    return None


def report_errors(errors: dict[Path, SpecError]) -> None:
    """File each broken file's problems as an import error of that file.

    Under Airflow's importer they join its result (the DagBag logs each one, and
    the DAG processor records them); elsewhere they are logged and warned.
    """
    if not errors:
        return
    found = _airflow_import_result()
    for path, error in errors.items():
        first = error.issues[0] if error.issues else None
        if found is None:
            log.error("tideflow: %s", error)
            warnings.warn_explicit(
                str(error), PipelineImportWarning, str(path), first.line if first else 1
            )
            continue
        from airflow.dag_processing.importers.base import DagImportError

        import_result, bundle = found
        try:
            shown = str(path.relative_to(bundle)) if bundle else str(path)
        except ValueError:
            shown = str(path)
        import_result.errors.append(
            DagImportError(
                file_path=shown,
                message=str(error),
                error_type="tideflow-pipeline",
                line_number=first.line if first else None,
                column_number=first.column if first else None,
            )
        )


def report_setting_error(dag_file: str, error: ConfigError) -> None:
    """A setting the DAG file cannot use, as the DAG file's import error: its message
    alone (the setting, its value, what is accepted), not a traceback of our code."""
    found = _airflow_import_result()
    if found is None:
        log.error("tideflow: %s", error)
        warnings.warn_explicit(str(error), PipelineImportWarning, dag_file, 1)
        return
    from airflow.dag_processing.importers.base import DagImportError

    import_result, _ = found
    import_result.errors.append(
        DagImportError(
            file_path=import_result.file_path or dag_file,
            message=str(error),
            error_type="tideflow-configuration",
        )
    )


def register(namespace: dict[str, Any]) -> LoadResult:
    """Entry point of ``dags/tideflow_pipelines.py``: put the DAGs in the module's globals.
    A setting it cannot use defines no DAG and is the DAG file's import error."""
    try:
        return _register(namespace)
    except ConfigError as exc:
        report_setting_error(str(namespace.get("__file__", "tideflow_pipelines.py")), exc)
        return LoadResult()


def _register(namespace: dict[str, Any]) -> LoadResult:
    settings = Settings.from_env()
    inventory = None
    if settings.cluster_file is not None:
        try:
            inventory = load_cluster(settings.cluster_file)
        except SpecError as exc:
            report_errors({settings.cluster_file: exc})
            return LoadResult()
    pipelines_dir = settings.pipelines_dir
    if not pipelines_dir.exists():
        raise registry.declared("TIDEFLOW_PIPELINES_DIR").refuse(
            registry.raw("TIDEFLOW_PIPELINES_DIR"), f"{pipelines_dir} does not exist"
        )
    only = parsing_for()
    result = load_dags(pipelines_dir, inventory, only=only)
    for dag_id, dag in result.dags.items():
        namespace[f"tideflow__{dag_id.replace('-', '_')}"] = dag
    report_errors(result.errors if only is None else result.errors_for(only))
    return result


def parsing_for() -> str | None:
    """The DAG this parse is for, when Airflow parses the DAG file for one (a task's run)."""
    from airflow.sdk import get_parsing_context

    return get_parsing_context().dag_id


# The text of dags/tideflow_pipelines.py; ``tideflow run`` writes the same file
# into its private DAG folder, and a test keeps the two identical.
LOADER_SOURCE = '''"""Airflow DAG file: one DAG per pipeline file under $TIDEFLOW_PIPELINES_DIR.

The directory defaults to pipelines/. This file stays thin on purpose: it
imports no torch, mlflow or boto3 and touches no network. A broken pipeline
file shows as an Airflow import error naming that file and line.
"""

from tideflow.dag.loader import register

register(globals())
'''
