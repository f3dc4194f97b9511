"""What ``tideflow validate`` checks of a pipeline beyond its file.

Problems: ``module:function`` entry points that do not import with the
pipeline's code. Warnings, for a cluster target: paths of this machine the
steps would carry into pods. Both need more than the file (this environment's
packages, this machine's paths), which is why they are not part of loading it.
"""

from __future__ import annotations

from pathlib import Path

from tideflow.spec.cluster_paths import local_path_warnings
from tideflow.spec.errors import SpecIssue
from tideflow.spec.loader import display_path
from tideflow.spec.models import PipelineSpec
from tideflow.spec.yamlpos import load_yaml
from tideflow.steps.imports import import_issues

CLUSTER_TARGETS = ("kubernetes", "argo")


def deeper_checks(
    spec: PipelineSpec, file: Path, *, imports: bool, target: str
) -> tuple[list[SpecIssue], list[SpecIssue]]:
    """Problems (entry points that do not import, when ``imports``), then warnings
    (local paths carried into pods, for a cluster ``target``), located in ``file``."""
    shown = display_path(file)
    positions = load_yaml(file.read_text(encoding="utf-8"), shown).positions
    errors = import_issues(spec, shown, positions) if imports else []
    warnings = local_path_warnings(spec, shown, positions) if target in CLUSTER_TARGETS else []
    return errors, sorted(warnings)
