"""The pipeline's code location, step images and gang worker resources in the spec: what
each accepts, and bad input reported with file, line, field and what is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tideflow.compile.dag_plan import compile_dag_plan
from tideflow.spec import PipelineSpec, SpecError, load_pipeline, parse_model

HEADER = """\
apiVersion: tideflow/v1
kind: Pipeline
metadata: {name: case, team: vision}
"""
STEPS = """\
steps:
  - name: prep
    data_prep: {entrypoint: "team.prep:run"}
"""


def problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_pipeline(path)
    return [str(issue) for issue in caught.value.issues]


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_code_path_is_relative_to_the_pipeline_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "repo" / "src").mkdir(parents=True)
    path = write(tmp_path, HEADER + "code: {path: ../src}\n" + STEPS, "repo/pipelines/p.yaml")
    monkeypatch.chdir(tmp_path)  # somewhere else entirely
    spec = load_pipeline(path)
    assert spec.code_dir() == tmp_path / "repo" / "src"
    assert compile_dag_plan(spec).code_path == str(tmp_path / "repo" / "src")


def test_a_missing_code_directory_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "code:\n  path: ./src\n" + STEPS)
    assert problems(path) == [
        f"{path}:5:9: code.path: code directory {tmp_path / 'src'} does not exist; a "
        "directory of Python modules, relative to the pipeline file's directory "
        f"({tmp_path}) or absolute"
    ]
    (tmp_path / "src").write_text("not a directory")
    assert "is not a directory" in problems(path)[0]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (
            "{path: ./src, package: team}",
            "4:7: code: code has both 'path' and 'package'; either 'path: ./src' (a "
            "directory next to the pipeline) or 'package: NAME' (an installed package)",
        ),
        ("{}", "4:7: code: code has neither 'path' nor 'package'"),
        (
            "{package: team-train}",
            "4:17: code.package: 'team-train' is not an import package name; a dotted Python "
            "package name such as 'vision_train' or 'team.models'",
        ),
        (
            "{path: ./src, image_path: src}",
            "4:33: code.image_path: 'src' is not an absolute path; the directory's absolute "
            "path inside the image, such as '/opt/team/src'",
        ),
        (
            "{package: team, image_path: /src}",
            "4:7: code: 'image_path' goes with 'path'; 'path' and 'image_path' together, "
            "or 'package' alone",
        ),
        ("{path: '{{ params.src }}'}", "4:14: code.path: '{{ params.src }}' is not a direct"),
        ("{module: team}", "4:8: code.module: unknown field 'module'; accepted fields: path, "),
    ],
)
def test_bad_code_locations_say_what_is_accepted(tmp_path: Path, code: str, expected: str) -> None:
    (tmp_path / "src").mkdir()
    path = write(tmp_path, HEADER + f"code: {code}\n" + STEPS)
    found = problems(path)
    assert any(line.startswith(f"{path}:{expected}") for line in found), found


def test_an_installed_package_needs_no_path(tmp_path: Path) -> None:
    spec = load_pipeline(write(tmp_path, HEADER + "code: {package: team.train}\n" + STEPS))
    assert spec.code is not None and spec.code.package == "team.train"
    assert spec.code_dir() is None and compile_dag_plan(spec).code_path is None


def test_the_step_image_wins_over_the_pipelines(tmp_path: Path) -> None:
    text = (
        HEADER
        + "image: registry.example.com/vision/base:2.1\n"
        + """\
steps:
  - name: prep
    data_prep: {entrypoint: "team.prep:run"}
  - name: train
    image: registry.example.com/vision/train@sha256:"""
        + "ab" * 32
        + """
    gang_training: {entrypoint: [python, -m, team.train], workers: 1}
"""
    )
    plan = compile_dag_plan(load_pipeline(write(tmp_path, text)))
    images = {task.task_id: task.image for task in plan.tasks}
    assert images == {
        "prep": "registry.example.com/vision/base:2.1",
        "train": "registry.example.com/vision/train@sha256:" + "ab" * 32,
    }
    plain = compile_dag_plan(load_pipeline(write(tmp_path, HEADER + STEPS, "plain.yaml")))
    assert [task.image for task in plain.tasks] == [None]  # the platform's default


@pytest.mark.parametrize(
    ("where", "value", "position"),
    [
        ("pipeline", "Registry.example.com/Team:1", "4:8: image"),
        ("step", "a b", "6:12: steps[0].image"),
    ],
)
def test_a_bad_image_reference_is_refused_with_its_line(
    tmp_path: Path, where: str, value: str, position: str
) -> None:
    text = HEADER + (f"image: '{value}'\n" if where == "pipeline" else "")
    text += "steps:\n  - name: prep\n"
    text += f"    image: '{value}'\n" if where == "step" else ""
    text += '    data_prep: {entrypoint: "team.prep:run"}\n'
    path = write(tmp_path, text)
    (found,) = problems(path)
    assert found == (
        f"{path}:{position}: '{value}' is not an image reference; a container image "
        "reference such as 'registry.example.com/team/train:1.4' or "
        "'registry.example.com/team/train@sha256:<digest>' (no templates)"
    )


GANG = """\
steps:
  - name: train
    gang_training:
      entrypoint: {entrypoint}
      workers: 2
      device: {{class: {device}}}
      resources: {resources}
"""


def test_gang_resources_are_per_worker_cpu_and_memory(tmp_path: Path) -> None:
    text = HEADER + GANG.format(
        entrypoint="[python, -m, team.train]", device="gpu", resources="{cpu: 8, memory: 64Gi}"
    )
    (task,) = compile_dag_plan(load_pipeline(write(tmp_path, text))).tasks
    assert task.gang is not None and (task.gang.cpu, task.gang.memory) == ("8", "64Gi")
    text = HEADER + GANG.format(entrypoint="[python, -m, team.train]", device="cpu", resources="{}")
    (task,) = compile_dag_plan(load_pipeline(write(tmp_path, text))).tasks
    assert task.gang is not None and (task.gang.cpu, task.gang.memory) == (None, None)


@pytest.mark.parametrize(
    ("device", "resources", "expected"),
    [
        (
            "cpu",
            "{cpu: 4}",
            "10:24: steps[0].gang_training.resources.cpu: a cpu gang's cores per worker are "
            "its devices_per_worker; devices_per_worker: N (cores per worker) and no "
            "resources.cpu; resources.cpu is for gpu and npu gangs",
        ),
        (
            "gpu",
            "{memory: lots}",
            "10:27: steps[0].gang_training.resources.memory: 'lots' is not a memory quantity; "
            "a Kubernetes memory quantity such as '512Mi', '4Gi' or a number of bytes",
        ),
        (
            "gpu",
            "{devices: 2}",
            "10:19: steps[0].gang_training.resources.devices: unknown field 'devices'; "
            "accepted fields: cpu, memory",
        ),
    ],
)
def test_bad_gang_resources_say_what_is_accepted(
    tmp_path: Path, device: str, resources: str, expected: str
) -> None:
    text = HEADER + GANG.format(
        entrypoint="[python, -m, team.train]", device=device, resources=resources
    )
    path = write(tmp_path, text)
    assert problems(path) == [f"{path}:{expected}"]


def test_a_gang_commands_args_must_be_option_names(tmp_path: Path) -> None:
    text = (
        HEADER
        + """\
steps:
  - name: train
    gang_training:
      entrypoint: [python, -m, team.train]
      workers: 1
      args: {lr: 0.1, "warm up": 3}
"""
    )
    path = write(tmp_path, text)
    assert problems(path) == [
        f"{path}:9:23: steps[0].gang_training.args.warm up: args key 'warm up' cannot be a "
        "command-line option (a command's args are appended as --KEY VALUE); keys of "
        "letters, digits, '_', '-' and '.', starting with a letter or digit"
    ]
    # the same keys are keyword arguments of a module:function entry point: no options there
    module = text.replace("[python, -m, team.train]", "team.train:main")
    assert load_pipeline(write(tmp_path, module, "module.yaml"))


def test_text_without_a_file_resolves_code_against_the_given_directory(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    text = HEADER + "code: {path: src}\n" + STEPS
    spec = parse_model(text, "<text>", PipelineSpec, source_dir=tmp_path)
    assert spec.code_dir() == tmp_path / "src"
