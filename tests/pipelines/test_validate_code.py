"""``tideflow validate`` imports every module entry point with the pipeline's code, and
warns, for a cluster target, about paths of this machine the steps would carry into pods."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.stack.test_cli import tideflow

pytestmark = pytest.mark.processes

PIPELINE = """\
apiVersion: tideflow/v1
kind: Pipeline
metadata: {name: imports, team: qa}
code: {path: ../src}
steps:
  - name: prep
    data_prep: {entrypoint: "teamcode.prep:run", args: {rows: 10}}
  - name: train
    needs: [prep]
    gang_training:
      entrypoint: teamcode.train:main
      workers: 1
  - name: evaluate
    needs: [train]
    evaluation: {entrypoint: "teamcode.evaluate:score", devices: [cpu], metrics: [accuracy]}
  - name: promote
    needs: [evaluate]
    promote_checkpoint:
      model: m
      builder: teamcode.build:log_model
      gate: {metric: accuracy}
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A team's repository: src/teamcode (its modules) and pipelines/imports.yaml."""
    package = tmp_path / "src" / "teamcode"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for module, function in (
        ("prep", "run"),
        ("train", "main"),
        ("evaluate", "score"),
        ("build", "log_model"),
    ):
        (package / f"{module}.py").write_text(f"def {function}(ctx, **args):\n    return {{}}\n")
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "imports.yaml").write_text(PIPELINE)
    return tmp_path


def validate(repo: Path, *args: str) -> tuple[int, list[str]]:
    done = tideflow("validate", "pipelines/imports.yaml", *args, cwd=repo)
    assert "Traceback" not in done.stderr
    return done.returncode, done.stderr.splitlines()


def test_entry_points_import_with_the_pipelines_code(repo: Path) -> None:
    code, lines = validate(repo)
    assert code == 0, lines


def test_entry_points_that_do_not_import_are_named_with_line_field_and_error(
    repo: Path,
) -> None:
    package = repo / "src" / "teamcode"
    (package / "evaluate.py").write_text("def scores(ctx):\n    pass\n")
    (package / "build.py").write_text("import not_installed_anywhere\n")
    (package / "prep.py").unlink()
    code, lines = validate(repo)
    assert code == 1
    src = repo / "src"
    accepted = (
        f"a module:function that imports with the pipeline's code (code.path {src}) or from "
        "an installed package; set code.path to the directory that holds the module"
    )
    assert lines[0] == "pipelines/imports.yaml: 3 problems"
    assert lines[1] == (
        "pipelines/imports.yaml:7:29: steps[0].data_prep.entrypoint: cannot import "
        "'teamcode.prep:run': ModuleNotFoundError: No module named 'teamcode.prep'; " + accepted
    )
    assert lines[2].startswith(
        "pipelines/imports.yaml:15:30: steps[2].evaluation.entrypoint: cannot import "
        f"'teamcode.evaluate:score': module 'teamcode.evaluate' ({src}/teamcode/evaluate.py) "
        "has no attribute 'score' (did you mean 'scores'?); "
    )
    assert lines[3].startswith(
        "pipelines/imports.yaml:20:16: steps[3].promote_checkpoint.builder: cannot import "
        "'teamcode.build:log_model': ModuleNotFoundError: No module named "
        f"'not_installed_anywhere' ({src}/teamcode/build.py:1); "
    )
    # the same modules, without the pipeline's code location: nothing imports
    text = (repo / "pipelines" / "imports.yaml").read_text()
    (repo / "pipelines" / "imports.yaml").write_text(text.replace("code: {path: ../src}\n", ""))
    code, lines = validate(repo)
    assert code == 1 and "No module named 'teamcode'" in lines[1]
    assert "(no code.path)" in lines[1]
    assert validate(repo, "--no-imports")[0] == 0


def test_a_code_package_must_be_installed(repo: Path) -> None:
    text = PIPELINE.replace("code: {path: ../src}", "code: {package: teamcode_not_here}")
    (repo / "pipelines" / "imports.yaml").write_text(text)
    code, lines = validate(repo)
    assert code == 1
    assert (
        "pipelines/imports.yaml:4:17: code.package: cannot import package 'teamcode_not_here': "
        "ModuleNotFoundError: No module named 'teamcode_not_here'; a package installed in "
        "this environment (pip install it), or 'path: DIR' for a directory of modules next "
        "to the pipeline"
    ) in lines


def test_a_module_that_fails_to_import_says_where(repo: Path) -> None:
    (repo / "src" / "teamcode" / "train.py").write_text(
        "\n\nraise RuntimeError('needs a GPU driver')\n"
    )
    code, lines = validate(repo)
    assert code == 1
    assert (
        "pipelines/imports.yaml:11:19: steps[1].gang_training.entrypoint: cannot import "
        "'teamcode.train:main': RuntimeError: needs a GPU driver "
        f"({repo}/src/teamcode/train.py:3); "
    ) in "\n".join(lines)


def test_a_cluster_target_warns_about_local_paths_carried_into_pods(
    repo: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data.csv"
    data.write_text("x\n")
    text = PIPELINE.replace("args: {rows: 10}", f"args: {{rows: 10, table: {data}}}")
    text = text.replace(
        "      workers: 1\n",
        "      workers: 1\n      env: {OUT: /opt/in-image, CACHE: "
        + str(Path.home())
        + "/cache}\n",
    )
    (repo / "pipelines" / "imports.yaml").write_text(text)
    assert validate(repo) == (0, [])  # locally, local paths are fine
    code, lines = validate(repo, "--target", "kubernetes")
    assert code == 0  # warnings, not errors
    remedy = (
        "a path the pods have (a volume mounted at the same place, or one inside the image), "
        "or a store URI such as s3://bucket/key"
    )
    rows = text.splitlines()
    table = rows[6].index(str(data)) + 1
    cache = rows[12].index(f"{Path.home()}/cache") + 1
    assert lines == [
        f"pipelines/imports.yaml:4:14: code.path: warning: code directory {repo / 'src'} is "
        "on this machine; Argo step pods and gang pods do not have it; code.image_path: "
        "where the step images hold the same directory (put first on PYTHONPATH in pods), "
        "or code.package for code installed in the image",
        f"pipelines/imports.yaml:7:{table}: steps[0].data_prep.args.table: warning: '{data}' "
        f"is a path on this machine; pods do not have it; {remedy}",
        f"pipelines/imports.yaml:13:{cache}: steps[1].gang_training.env.CACHE: warning: "
        f"'{Path.home()}/cache' is a path on this machine; pods do not have it; {remedy}",
    ]
    # naming where the image has the code answers the code warning
    (repo / "pipelines" / "imports.yaml").write_text(
        text.replace("{path: ../src}", "{path: ../src, image_path: /opt/src}")
    )
    code, lines = validate(repo, "--target", "argo")
    assert code == 0 and not any("code.path" in line for line in lines)
    assert len([line for line in lines if "warning:" in line]) == 2


def test_the_backend_setting_is_the_default_target_and_compile_warns_too(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (repo / "out").mkdir()
    text = PIPELINE.replace("args: {rows: 10}", f"args: {{out: {repo}/out}}")
    (repo / "pipelines" / "imports.yaml").write_text(text)
    monkeypatch.setenv("TIDEFLOW_BACKEND", "kubernetes")
    code, lines = validate(repo)
    assert code == 0 and any("steps[0].data_prep.args.out: warning:" in line for line in lines)
    monkeypatch.delenv("TIDEFLOW_BACKEND")
    # a script path under the pipeline's own directory, in a gang's command
    gang = textwrap.dedent(f"""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {{name: argo, team: qa}}
        steps:
          - name: train
            gang_training: {{entrypoint: [python, {tmp_path}/train.py], workers: 1}}
        """)
    (tmp_path / "argo.yaml").write_text(gang)
    done = tideflow("compile", "argo.yaml", "--target", "argo", "-o", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(
        "argo.yaml:6:42: steps[0].gang_training.entrypoint[1]: warning: "
        f"'{tmp_path}/train.py' is a path on this machine; pods do not have it; "
    )
    assert (tmp_path / "out" / "argo.workflowtemplate.yaml").exists()


def test_plan_shows_the_code_images_and_per_worker_resources(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "p.yaml").write_text(
        textwrap.dedent("""\
        apiVersion: tideflow/v1
        kind: Pipeline
        metadata: {name: plan, team: qa}
        code: {path: src, image_path: /opt/src}
        image: registry.example.com/qa/base:1
        steps:
          - name: train
            image: registry.example.com/qa/train:2
            gang_training:
              entrypoint: [python, -m, qa.train]
              workers: 2
              device: {class: gpu}
              resources: {cpu: 6, memory: 48Gi}
        """)
    )
    done = tideflow("plan", "p.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"code: {tmp_path / 'src'} (in the image: /opt/src)" in done.stdout
    assert "     per worker: cpu 6, memory 48Gi" in done.stdout
    assert "     image (cluster): registry.example.com/qa/train:2" in done.stdout


def test_an_evaluation_or_builder_that_cannot_take_tideflows_arguments_is_named(
    repo: Path,
) -> None:
    """The calling convention of tideflow.steps.contracts, checked before any run."""
    package = repo / "src" / "teamcode"
    (package / "evaluate.py").write_text("def score(ctx, checkpoint_store, threshold):\n    pass\n")
    (package / "build.py").write_text(
        "def log_model(ctx, *, checkpoint_store, checkpoint_step, checkpoint):\n    pass\n"
    )
    code, lines = validate(repo)
    assert code == 1 and lines[0] == "pipelines/imports.yaml: 2 problems"
    assert lines[1].startswith(
        "pipelines/imports.yaml:15:30: steps[2].evaluation.entrypoint: 'teamcode.evaluate:score' "
        "cannot be called as an evaluation: it does not accept keyword argument(s) "
        "['checkpoint', 'checkpoint_step']"
    )
    assert lines[2].startswith(
        "pipelines/imports.yaml:20:16: steps[3].promote_checkpoint.builder: "
        "'teamcode.build:log_model' cannot be called as a builder: it does not accept "
        "keyword argument(s) ['run_id']"
    )
