"""Pipeline spec v1: a table of valid and invalid pipelines with the exact error text."""

from __future__ import annotations

from pathlib import Path

import pytest

from tideflow.inventory import Inventory, load_cluster
from tideflow.spec import PipelineSpec, SpecError, load_pipeline, parse_model

FILE = "pipelines/case.yaml"
YAML_BOOLEANS = "YAML reads unquoted yes, no, on, off, true and false as booleans"

HEADER = """\
apiVersion: tideflow/v1
kind: Pipeline
metadata:
  name: case
  team: vision
"""

VALID = {
    "minimal data prep": HEADER
    + """\
steps:
  - name: prep
    data_prep:
      entrypoint: pkg.mod:prepare
""",
    "command list entry point and preset schedule": """\
apiVersion: tideflow/v1
kind: Pipeline
metadata: {name: case, team: vision, schedule: "@daily"}
steps:
  - name: prep
    timeout: 1h30m
    data_prep:
      entrypoint: [python, prep.py, --out, "{{ params.out }}"]
      resources: {cpu: 500m, memory: 512Mi}
params:
  out: {type: string, default: /tmp/out}
""",
    "all four kinds with templated gang size": HEADER
    + """\
  schedule: "0 2 * * *"
  paused_at_creation: false
params:
  workers: {type: int, default: 2, minimum: 1, maximum: 8}
  optimizer: {type: enum, values: [sgd, adam], default: adam}
  delta: {type: float, default: 0.01, minimum: 0}
  debug: {type: bool, default: false}
steps:
  - name: prep
    data_prep: {entrypoint: "pkg.mod:prepare", outputs: [train]}
  - name: train
    needs: [prep]
    retries: 2
    gang_training:
      entrypoint: pkg.mod:train
      workers: "{{ params.workers }}"
      devices_per_worker: 8
      device: {class: gpu, model: H100}
      checkpoint: {store: "s3://ckpt/x", every_steps: 100, keep_last: 2,
                   keep_best: {metric: val_loss, mode: min}}
      args: {optimizer: "{{ params.optimizer }}", debug: "{{ params['debug'] }}"}
  - name: eval
    needs: [train]
    evaluation: {entrypoint: "pkg.mod:evaluate", devices: [npu, gpu-spare, cpu],
                 metrics: [accuracy]}
  - name: promote
    needs: [eval]
    promote_checkpoint:
      model: digits-classifier
      gate: {metric: accuracy, min_delta: "{{ params.delta }}",
             thresholds: {accuracy: {min: 0.9}}}
""",
}

INVALID = {
    "yaml syntax error": (
        HEADER + "steps:\n  - name: [prep\n",
        [
            f"{FILE}:8:1: (document): YAML syntax error: while parsing a flow sequence "
            "started at 7:11, did not find expected ',' or ']'; "
            "fix the YAML syntax (indentation, quotes, ':' after keys)"
        ],
    ),
    "a tab in the indentation": (
        HEADER + "steps:\n  - name: prep\n\tdata_prep: {entrypoint: pkg.mod:prepare}\n",
        [
            f"{FILE}:8:1: (document): YAML syntax error: while scanning a plain scalar "
            "started at 7:11, found a tab character that violates indentation; "
            "indent with spaces: YAML allows no tabs in indentation"
        ],
    ),
    "a block indented with tabs": (
        "apiVersion: tideflow/v1\nkind: Pipeline\nmetadata:\n\tname: case\n",
        [
            f"{FILE}:4:1: (document): YAML syntax error: while scanning for the next token "
            "started at 4:1, found character that cannot start any token; "
            "indent with spaces: YAML allows no tabs in indentation"
        ],
    ),
    "unknown key with suggestion": (
        HEADER
        + """\
steps:
  - name: prep
    data_prep:
      entrypoint: pkg.mod:prepare
      resourcez: {cpu: 1}
""",
        [
            f"{FILE}:10:7: steps[0].data_prep.resourcez: unknown field 'resourcez'; did you "
            "mean 'resources'? accepted fields: entrypoint, args, env, resources, pool, outputs"
        ],
    ),
    "a step's field one level too deep": (
        HEADER
        + """\
steps:
  - name: prep
    data_prep:
      entrypoint: pkg.mod:prepare
      retries: 2
""",
        [
            f"{FILE}:10:7: steps[0].data_prep.retries: unknown field 'retries'; 'retries' is "
            "a field of steps[0], one level up; accepted fields: entrypoint, args, env, "
            "resources, pool, outputs"
        ],
    ),
    "wrong types and out of range, all reported": (
        HEADER
        + """\
steps:
  - name: train
    retries: many
    gang_training:
      entrypoint: pkg.mod:train
      workers: 0
      devices_per_worker: two
      preemptible: maybe
""",
        [
            f"{FILE}:8:14: steps[0].retries: expected an integer, got str 'many'; "
            "an integer between 0 and 20",
            f"{FILE}:11:16: steps[0].gang_training.workers: 0 is out of range; an integer "
            "between 1 and 4096, or a template such as '{{ params.workers }}'",
            f"{FILE}:12:27: steps[0].gang_training.devices_per_worker: expected an integer, "
            "got str 'two'; an integer between 1 and 64, or a template such as "
            "'{{ params.workers }}'",
            f"{FILE}:13:20: steps[0].gang_training.preemptible: expected true or false, "
            "got 'maybe'; true or false",
        ],
    ),
    "YAML booleans (yes, on, ...) and quoted numbers where numbers belong": (
        HEADER
        + """\
params:
  size: {type: int, default: 2, minimum: yes, maximum: "8"}
  mode: {type: enum, values: [on, off], default: on}
steps:
  - name: train
    retries: yes
    gang_training:
      entrypoint: pkg.mod:train
      workers: on
      max_restarts: off
      checkpoint: {keep_last: true, every_steps: "{{ params.size }}"}
""",
        [
            f"{FILE}:7:42: params.size.minimum: expected a number, got the boolean true "
            f"({YAML_BOOLEANS}); a number such as 1, 0.5 or 1e-3",
            f"{FILE}:7:56: params.size.maximum: expected a number, got str '8'; "
            "a number such as 1, 0.5 or 1e-3",
            f"{FILE}:8:31: params.mode.values[0]: expected a choice, got the boolean true "
            f"({YAML_BOOLEANS}); text, an integer or a number; quote "
            "yes/no/on/off/true/false to mean the text",
            f"{FILE}:8:35: params.mode.values[1]: expected a choice, got the boolean false "
            f"({YAML_BOOLEANS}); text, an integer or a number; quote "
            "yes/no/on/off/true/false to mean the text",
            f"{FILE}:11:14: steps[0].retries: expected an integer, got the boolean true "
            f"({YAML_BOOLEANS}); an integer between 0 and 20",
            f"{FILE}:14:16: steps[0].gang_training.workers: expected an integer, got the "
            f"boolean true ({YAML_BOOLEANS}); an integer between 1 and 4096, or a template "
            "such as '{{ params.workers }}'",
            f"{FILE}:15:21: steps[0].gang_training.max_restarts: expected an integer, got the "
            f"boolean false ({YAML_BOOLEANS}); an integer between 0 and 100, or a template "
            "such as '{{ params.workers }}'",
            f"{FILE}:16:31: steps[0].gang_training.checkpoint.keep_last: expected an "
            f"integer, got the boolean true ({YAML_BOOLEANS}); an integer >= 1, or a "
            "template such as '{{ params.workers }}'",
        ],
    ),
    "unknown needs, duplicate names and a cycle": (
        HEADER
        + """\
steps:
  - name: prep
    needs: [trian]
    data_prep: {entrypoint: "a:b"}
  - name: train
    needs: [eval]
    data_prep: {entrypoint: "a:b"}
  - name: eval
    needs: [train]
    data_prep: {entrypoint: "a:b"}
  - name: prep
    data_prep: {entrypoint: "a:b"}
""",
        [
            f"{FILE}:8:13: steps[0].needs[0]: unknown step 'trian'; did you mean 'train'? "
            "steps are: prep, train, eval",
            f"{FILE}:11:12: steps[1].needs: dependency cycle: train -> eval -> train; "
            "steps must form a DAG; remove one of these needs",
            f"{FILE}:16:11: steps[3].name: duplicate step name 'prep' (also steps[0]); "
            "unique step names",
        ],
    ),
    "paused_at_creation is true, false or null": (
        HEADER
        + """\
  paused_at_creation: 0
steps:
  - name: prep
    data_prep: {entrypoint: "a:b"}
""",
        [f"{FILE}:6:23: metadata.paused_at_creation: expected true or false, got 0; true or false"],
    ),
    "invalid cron": (
        HEADER
        + """\
  schedule: "0 25 * * *"
steps:
  - name: prep
    data_prep: {entrypoint: "a:b"}
""",
        [
            f"{FILE}:6:13: metadata.schedule: '0 25 * * *' is not a valid cron expression; "
            "five fields 'minute hour day-of-month month day-of-week' such as '0 2 * * *', "
            "one of @once, @continuous, @hourly, @daily, @weekly, @monthly, @quarterly, "
            "@yearly, or null"
        ],
    ),
    "missing fields and a step with two kinds": (
        """\
apiVersion: tideflow/v2
kind: Pipeline
metadata:
  team: vision
steps:
  - name: prep
    data_prep: {entrypoint: "a:b"}
    evaluation: {entrypoint: "a:c", metrics: [accuracy]}
""",
        [
            f"{FILE}:1:13: apiVersion: 'tideflow/v2' is not accepted; one of 'tideflow/v1'",
            f"{FILE}:4:3: metadata.name: required field 'name' is missing; add 'name:'",
            f"{FILE}:6:5: steps[0]: step 'prep' has several kinds (data_prep, evaluation); "
            "exactly one of data_prep, gang_training, evaluation, promote_checkpoint",
        ],
    ),
    "params: bad default, bounds on a string, undeclared reference": (
        HEADER
        + """\
params:
  lr: {type: float, default: 2.0, maximum: 1.0}
  name: {type: string, default: x, minimum: 1}
steps:
  - name: prep
    data_prep:
      entrypoint: a:b
      args: {lr: "{{ params.lrr }}"}
""",
        [
            f"{FILE}:7:7: params.lr: default 2.0 is above maximum 1.0; a default <= 1.0",
            f"{FILE}:8:9: params.name: minimum/maximum do not apply to a 'string' parameter; "
            "bounds only on 'int' or 'float' parameters",
            f"{FILE}:13:18: steps[0].data_prep.args.lr: template refers to undeclared param "
            "'lrr'; did you mean 'lr'? declared params: lr, name",
        ],
    ),
    "gate metrics the upstream evaluation does not declare": (
        HEADER
        + """\
steps:
  - name: train
    gang_training: {entrypoint: "a:b", workers: 1}
  - name: evaluate
    needs: [train]
    evaluation: {entrypoint: "a:c", metrics: [accuracy, loss]}
  - name: report
    needs: [evaluate]
    data_prep: {entrypoint: "a:d"}
  - name: promote
    needs: [report]
    promote_checkpoint:
      model: m
      gate:
        metric: auc
        thresholds:
          acuracy: {min: 0.9}
          loss: {max: 0.5}
""",
        [
            f"{FILE}:20:17: steps[3].promote_checkpoint.gate.metric: gate metric 'auc' is not "
            "a metric of evaluation step 'evaluate', which the promotion reads; one of its "
            "declared metrics: accuracy, loss",
            f"{FILE}:22:11: steps[3].promote_checkpoint.gate.thresholds.acuracy: threshold "
            "metric 'acuracy' is not a metric of evaluation step 'evaluate', which the "
            "promotion reads; did you mean 'accuracy'? one of its declared metrics: "
            "accuracy, loss",
        ],
    ),
    "duplicate yaml key": (
        HEADER
        + """\
steps:
  - name: prep
    name: prep2
    data_prep: {entrypoint: "a:b"}
""",
        [
            f"{FILE}:8:5: steps[0].name: duplicate key 'name' (the earlier value would be "
            "lost); each key may appear once per mapping"
        ],
    ),
}

CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: lab}
nodes:
  - {name: h100, count: 2, cpu: 96, accelerators: {class: gpu, model: H100, count: 8}}
  - {name: a100, count: 4, cpu: 64, accelerators: {class: gpu, model: A100, count: 4}}
  - {name: v100, count: 4, cpu: 64, accelerators: {class: gpu, model: V100, count: 4}}
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Inventory:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    return load_cluster(path)


@pytest.mark.parametrize("text", VALID.values(), ids=VALID.keys())
def test_valid_pipelines_load(text: str) -> None:
    spec = parse_model(text, FILE, PipelineSpec)
    assert spec.metadata.name == "case"
    with pytest.raises(Exception, match="frozen"):
        spec.metadata.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(("text", "expected"), INVALID.values(), ids=INVALID.keys())
def test_invalid_pipelines_report_every_error_exactly(text: str, expected: list[str]) -> None:
    with pytest.raises(SpecError) as caught:
        parse_model(text, FILE, PipelineSpec)
    assert [str(issue) for issue in caught.value.issues] == expected


def test_gang_that_can_never_fit_the_declared_cluster(cluster: Inventory) -> None:
    text = (
        HEADER
        + """\
steps:
  - name: train
    gang_training:
      entrypoint: pkg.mod:train
      workers: 3
      devices_per_worker: 8
      device: {class: gpu, model: H100}
"""
    )
    with pytest.raises(SpecError) as caught:
        parse_model(text, FILE, PipelineSpec, cluster)
    assert [str(i) for i in caught.value.issues] == [
        f"{FILE}:10:16: steps[0].gang_training.workers: 3 workers x 8 H100 gpu can never be "
        "placed on cluster 'lab' (2 nodes with 8 H100 gpu; room for at most 2 such workers); "
        "workers <= 2, fewer devices_per_worker, or a larger cluster"
    ]


def test_gang_never_mixes_models_when_none_is_named(cluster: Inventory) -> None:
    # 4 A100 nodes + 4 V100 nodes of 4 GPUs: 32 GPUs, but at most 16 of one model.
    template = (
        HEADER
        + """\
params:
  workers: {{type: int, default: {workers}}}
steps:
  - name: train
    gang_training:
      entrypoint: pkg.mod:train
      workers: "{{{{ params.workers }}}}"
      devices_per_worker: 4
      device: {{class: gpu}}
"""
    )
    assert parse_model(template.format(workers=2), FILE, PipelineSpec, cluster)
    with pytest.raises(SpecError, match="room for at most 4 such workers"):
        parse_model(template.format(workers=8), FILE, PipelineSpec, cluster)


def test_the_gate_is_checked_against_the_nearest_upstream_evaluation() -> None:
    """The promotion reads the metrics of the nearest evaluation upstream (as the compiler
    wires it): a metric only a farther one declares is an error; a templated gate metric is
    left to the run (a metric missing then fails the step)."""
    text = (
        HEADER
        + """\
params:
  gate_metric: {type: string, default: auc}
steps:
  - name: train
    gang_training: {entrypoint: "a:b", workers: 1}
  - name: eval-a
    needs: [train]
    evaluation: {entrypoint: "a:c", metrics: [f1]}
  - name: eval-b
    needs: [eval-a]
    evaluation: {entrypoint: "a:c", metrics: [accuracy]}
  - name: promote
    needs: [eval-b]
    promote_checkpoint:
      model: m
      gate: {metric: GATE}
"""
    )
    assert parse_model(text.replace("GATE", "accuracy"), FILE, PipelineSpec)
    assert parse_model(text.replace("GATE", '"{{ params.gate_metric }}"'), FILE, PipelineSpec)
    with pytest.raises(SpecError) as caught:
        parse_model(text.replace("GATE", "f1"), FILE, PipelineSpec)
    assert [str(i) for i in caught.value.issues] == [
        f"{FILE}:21:22: steps[3].promote_checkpoint.gate.metric: gate metric 'f1' is not a "
        "metric of evaluation step 'eval-b', which the promotion reads; one of its declared "
        "metrics: accuracy"
    ]


def test_real_file_errors_name_the_path(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(HEADER + "steps: []\n")
    with pytest.raises(SpecError) as caught:
        load_pipeline(path)
    assert str(caught.value.issues[0]).startswith(f"{path}:6:8: steps: needs at least 1 item")


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(SpecError) as caught:
        load_pipeline(empty)
    assert [str(i) for i in caught.value.issues] == [
        f"{empty}:1:1: (document): the file is empty; a pipeline file (kind: Pipeline)"
    ]
    with pytest.raises(SpecError, match="file not found"):
        load_pipeline(tmp_path / "absent.yaml")


def test_shipped_example_pipelines_are_valid(repo: Path) -> None:
    from tideflow.spec import find_pipelines

    files = find_pipelines(repo / "pipelines")
    assert [f.name for f in files] == ["digits.yaml"]
    for file in files:
        load_pipeline(file)


def test_a_file_of_the_other_kind_is_one_problem_saying_so() -> None:
    """A pipeline file named where a cluster file goes (``--cluster``), and the other
    way round: the kind is the problem, not each field the other kind lacks."""
    from tideflow.inventory import ClusterSpec

    with pytest.raises(SpecError) as caught:
        parse_model(VALID["minimal data prep"], "digits.yaml", ClusterSpec)
    assert [str(i) for i in caught.value.issues] == [
        "digits.yaml:2:7: kind: this is a pipeline file (kind: Pipeline); "
        "a cluster file (kind: Cluster) is wanted here"
    ]
    with pytest.raises(SpecError) as caught:
        parse_model(CLUSTER, "lab.yaml", PipelineSpec)
    assert [str(i) for i in caught.value.issues] == [
        "lab.yaml:2:7: kind: this is a cluster file (kind: Cluster); "
        "a pipeline file (kind: Pipeline) is wanted here"
    ]


def test_cluster_file_integers_refuse_booleans() -> None:
    from tideflow.inventory import ClusterSpec

    text = CLUSTER.replace("count: 2, cpu: 96", "count: yes, cpu: 96").replace(
        "model: A100, count: 4}", "model: A100, count: on}"
    )
    with pytest.raises(SpecError) as caught:
        parse_model(text, "cluster.yaml", ClusterSpec)
    boolean = (
        "got the boolean true (YAML reads unquoted yes, no, on, off, true and false as booleans)"
    )
    assert [str(issue) for issue in caught.value.issues] == [
        f"cluster.yaml:5:25: nodes[0].count: expected an integer, {boolean}; "
        "an integer between 1 and 100000",
        f"cluster.yaml:6:84: nodes[1].accelerators.count: expected an integer, {boolean}; "
        "an integer between 1 and 64",
    ]


def test_a_priority_class_needs_a_cluster_file_that_declares_classes(
    cluster: Inventory, tmp_path: Path
) -> None:
    """A run of a pipeline naming a class is refused where the cluster file declares no
    classes (``tideflow.gangs.resolve_gang``), so validation says so first, at the
    field, rather than letting the DAG load and every run fail."""
    path = tmp_path / "p.yaml"
    path.write_text(
        "apiVersion: tideflow/v1\nkind: Pipeline\nmetadata:\n  name: p\n  team: vision\n"
        "  priority_class: urgent\nsteps:\n  - name: train\n"
        "    gang_training: {entrypoint: m:f, workers: 2, device: {class: gpu}}\n"
    )
    with pytest.raises(SpecError) as caught:
        load_pipeline(path, cluster)
    assert (
        "p.yaml:6:19: metadata.priority_class: priority class 'urgent' is named, but "
        "cluster file 'lab' declares no priority classes"
    ) in str(caught.value)
    path.write_text(path.read_text().replace("  priority_class: urgent\n", ""))
    assert load_pipeline(path, cluster).metadata.team == "vision"
