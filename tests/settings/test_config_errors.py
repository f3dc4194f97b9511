"""A setting the CLI cannot use is one message, never a traceback.

Every ``TIDEFLOW_*`` setting a command reads is driven with hostile values (empty,
non-numeric, zero, negative, huge, not finite, unknown words, paths that do not
exist or are not what they should be), one at a time on top of a working
configuration, through the commands that read it, run in-process as ``main(argv)``.
Either the command works, or it exits 2 with one line naming the variable, no
traceback, and nothing written to the lease ledger or the broker's journal.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tideflow.cli import main
from tideflow.settings_registry import SETTINGS

CLUSTER = """\
apiVersion: tideflow/v1
kind: Cluster
metadata: {name: lab}
nodes:
  - {name: n, count: 8, cpu: 8, accelerators: {class: gpu, model: T4, count: 1}}
teams:
  - {name: inference, quota: [{device: gpu, nominal: 4}]}
  - {name: research, quota: [{device: gpu, nominal: 4}]}
"""
HOSTILE = (
    "",
    " ",
    "abc",
    "0",
    "-1",
    "1.5",
    "1e400",
    "nan",
    "-inf",
    "99999999999999999999",
    "nomad",
    "none",
    "/no/such/path",
    "{tmp}/a-file",  # a file where a directory or a different file is wanted
    "{tmp}",  # a directory where a file is wanted
)
# what each command reads, besides HOSTILE: values shaped like the setting's own
BROKER = {
    "TIDEFLOW_BROKER_LOAD": (
        "trace:/no/such.csv",
        "trace:{tmp}/a-file",
        "trace:{tmp}/binary",
        "synthetic:-5",
        "x:y",
    ),
    "TIDEFLOW_BROKER_PER_GPU_RPS": (),
    "TIDEFLOW_BROKER_NODE_GPUS": ("8", "2"),
    "TIDEFLOW_BROKER_MIN_INFERENCE_GPUS": ("9", "4"),
    "TIDEFLOW_BROKER_GRACE_S": (),
    "TIDEFLOW_BROKER_LOST_WORK_BUDGET": ("1",),
    "TIDEFLOW_BROKER_STOP_COST_S": (),
    "TIDEFLOW_BROKER_DEVICE_CLASS": ("cpu", "npu", "tpu"),
    "TIDEFLOW_BROKER_LATENCY": ("prometheus:x", "synthetic:10"),
    "TIDEFLOW_BROKER_LATENCY_SLO_S": ("5",),
    "TIDEFLOW_BROKER_LATENCY_SLO_SHARE": ("0.5",),
    "TIDEFLOW_HOME": (),
    "TIDEFLOW_BACKEND": ("kubernetes ", "Local"),
    "TIDEFLOW_CLUSTER_FILE": (),
}
PLATFORM = (
    "TIDEFLOW_HOME",
    "TIDEFLOW_BACKEND",
    "TIDEFLOW_PIPELINES_DIR",
    "TIDEFLOW_CLUSTER_FILE",
    "TIDEFLOW_ARTIFACT_ROOT",
    "TIDEFLOW_CHECKPOINT_ROOTS",
)
DIGITS = str(Path(__file__).resolve().parents[2] / "pipelines" / "digits.yaml")
# the cluster settings a compile for Argo reads (tideflow.kube.settings)
KUBERNETES = tuple(
    s.name for s in SETTINGS if "cli" in s.readers and s.name.startswith("TIDEFLOW_K8S_")
)
COMMANDS = {
    ("broker", "run", "--dry-run", "--once"): (*BROKER, *PLATFORM[2:]),
    ("gangs",): PLATFORM,
    ("usage",): PLATFORM,
    ("compile", DIGITS, "--target", "argo"): (*KUBERNETES, "TIDEFLOW_ARTIFACT_ROOT"),
}
# what a command needs besides the working configuration (digits' team is not the lab's)
COMMAND_ENV = {("compile", DIGITS, "--target", "argo"): {"TIDEFLOW_CLUSTER_FILE": ""}}
SHAPED = {
    **BROKER,
    "TIDEFLOW_CLUSTER_FILE": ("{tmp}/binary", "{tmp}/a-file"),
    "TIDEFLOW_K8S_GRACE_S": ("29", "30.5"),
    "TIDEFLOW_K8S_GANG_SCHEDULER": ("Kueue",),
    "TIDEFLOW_K8S_DEVICE_MODELS": ("H100", "=x", "H100=,A100=y"),
    "TIDEFLOW_K8S_GANG_SERVICE_ACCOUNT": ("Upper", "a_b", "x" * 254),
    "TIDEFLOW_CHECKPOINT_ROOTS": ("=s3://x", "team=", ",,"),
}
CASES = [
    (command, name, value)
    for command, names in COMMANDS.items()
    for name in names
    for value in (*HOSTILE, *SHAPED.get(name, ()))
]


def run(argv: list[str], tmp: Path, env: dict[str, str]) -> tuple[int, str]:
    """The command as a user runs it, in a working configuration changed by ``env``."""
    (tmp / "a-file").write_text("start_s,rate_rps\n")
    (tmp / "binary").write_bytes(b"\xff\xfe\x00")
    (tmp / "cluster.yaml").write_text(CLUSTER)
    base = {
        "TIDEFLOW_HOME": str(tmp / "home"),
        "TIDEFLOW_CLUSTER_FILE": str(tmp / "cluster.yaml"),
        "TIDEFLOW_BROKER_LOAD": "synthetic:100",
        "TIDEFLOW_BROKER_PER_GPU_RPS": "50",
    }
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)  # an empty TIDEFLOW_HOME is the working directory
        for setting in SETTINGS:
            mp.delenv(setting.name, raising=False)
        for name, value in {**base, **env}.items():
            mp.setenv(name, value)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = int(exc.code or 0)
            except Exception as exc:  # what a user would have seen as a traceback
                return -1, f"Traceback: {type(exc).__name__}: {exc}"
    return code, out.getvalue()


def state_files(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.rglob("*") if p.name in ("leases.db", "broker.db"))


def test_every_setting_a_command_reads_is_driven() -> None:
    """What the registry says the CLI reads is what this test drives through a command."""
    driven = {name for names in COMMANDS.values() for name in names}
    assert driven == {s.name for s in SETTINGS if "cli" in s.readers}


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=st.sampled_from(CASES))
def test_a_hostile_setting_is_one_message_naming_it(case: tuple[tuple[str, ...], str, str]) -> None:
    command, name, template = case
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        value = template.format(tmp=tmp)
        code, out = run(list(command), tmp, {**COMMAND_ENV.get(command, {}), name: value})
        assert "Traceback" not in out, (name, value, out)
        if code == 0:
            return  # a value the command can use (a budget of none, a zero grace, ...)
        assert code == 2, (name, value, code, out)
        assert len(out.strip().splitlines()) == 1, (name, value, out)
        assert name in out, (name, value, out)
        assert state_files(tmp) == [], (name, value, out)


@pytest.mark.parametrize(
    ("argv", "name", "value"),
    [
        (["gangs"], "TIDEFLOW_CLUSTER_FILE", "/no/such/path"),  # a SpecError, exit 1
        (["usage"], "TIDEFLOW_CLUSTER_FILE", "{tmp}/binary"),
        (["gangs"], "TIDEFLOW_ARTIFACT_ROOT", ""),  # an empty root went through
        (["compile", DIGITS, "--target", "argo"], "TIDEFLOW_K8S_IMAGE", ""),  # hera asserted
        (["compile", DIGITS, "--target", "argo"], "TIDEFLOW_K8S_GRACE_S", "1e400"),
        # written into the WorkflowTemplate as it was
        (["compile", DIGITS, "--target", "argo"], "TIDEFLOW_ARTIFACT_ROOT", "ftp//nonsense"),
    ],
)
def test_the_other_commands_refuse_a_setting_by_name(
    tmp_path: Path, argv: list[str], name: str, value: str
) -> None:
    """Found by the sweep over every setting the CLI reads: a cluster file named by the
    setting is a configuration error (the file's first problem located in it), not the
    file's own error; an empty image escaped as a traceback from the Argo compiler."""
    env = {**COMMAND_ENV.get(tuple(argv), {}), name: value.format(tmp=tmp_path)}
    code, out = run(argv, tmp_path, env)
    assert (code, "Traceback" in out, name in out) == (2, False, True), out
    assert len(out.strip().splitlines()) == 1 and state_files(tmp_path) == []


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TIDEFLOW_BACKEND", "nomad"),
        ("TIDEFLOW_CLUSTER_FILE", ""),  # this machine: no GPU for the broker
        ("TIDEFLOW_BROKER_NODE_GPUS", "0"),
        ("TIDEFLOW_BROKER_NODE_GPUS", "-1"),
        ("TIDEFLOW_BROKER_MIN_INFERENCE_GPUS", "9"),
        ("TIDEFLOW_BROKER_DEVICE_CLASS", "tpu"),
        ("TIDEFLOW_BROKER_LOAD", "x:y"),
        ("TIDEFLOW_BROKER_LOAD", "trace:/no/such.csv"),
        ("TIDEFLOW_BROKER_LOAD", "trace:{tmp}/binary"),
        ("TIDEFLOW_HOME", "{tmp}/a-file/home"),
    ],
)
def test_the_settings_that_were_tracebacks_are_refused_by_name(
    tmp_path: Path, name: str, value: str
) -> None:
    """Each of these escaped as a traceback from ``tideflow broker run`` (and left a
    ledger behind, but for the first and the last)."""
    code, out = run(
        ["broker", "run", "--dry-run", "--once"], tmp_path, {name: value.format(tmp=tmp_path)}
    )
    assert (code, "Traceback" in out, name in out) == (2, False, True), out
    assert state_files(tmp_path) == []


def test_a_missing_cluster_server_is_one_message_naming_the_kubeconfig(tmp_path: Path) -> None:
    """``--backend kubernetes`` with no kubeconfig to reach a cluster by (and not in a pod)."""
    env = {"KUBECONFIG": str(tmp_path / "no-such-kubeconfig"), "HOME": str(tmp_path)}
    argv = ["broker", "run", "--backend", "kubernetes", "--dry-run", "--once"]
    code, out = run(argv, tmp_path, env)
    assert (code, "Traceback" in out, "KUBECONFIG" in out) == (2, False, True), out
    assert len(out.strip().splitlines()) == 1 and state_files(tmp_path) == []


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TIDEFLOW_K8S_GPUS_PER_REPLICA", "abc"),
        ("TIDEFLOW_K8S_GPUS_PER_REPLICA", "0"),
        ("TIDEFLOW_K8S_QUEUE_KIND", "yunikorn"),
        ("TIDEFLOW_K8S_GANG_SCHEDULER", "nomad"),
        ("TIDEFLOW_K8S_GRACE_S", "-1"),
    ],
)
def test_the_cluster_settings_are_configuration_errors(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """What the broker (``target_from_env``) and the gang backend (``kube_settings_from_env``)
    read of a cluster is checked before either reaches it, as the error the CLI prints as
    one message (a non-number was a traceback; a zero or an unknown queue kind went
    through)."""
    from tideflow.broker.kubernetes import target_from_env
    from tideflow.config import ConfigError
    from tideflow.kube.settings import kube_settings_from_env

    monkeypatch.setenv(name, value)
    reader = (
        kube_settings_from_env
        if name in ("TIDEFLOW_K8S_GANG_SCHEDULER", "TIDEFLOW_K8S_GRACE_S")
        else target_from_env
    )
    with pytest.raises(ConfigError, match=f"{name}='{value}'.*accepted: "):
        reader()
