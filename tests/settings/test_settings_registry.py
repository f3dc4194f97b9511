"""Every ``TIDEFLOW_*`` variable is declared once, and read only through the registry.

The source is scanned: a ``TIDEFLOW_*`` name that is not declared fails, and so does a
read of the environment (``os.environ``, ``getenv``, or a name bound to them) whose key
is a ``TIDEFLOW_*`` name, or a key that cannot be shown not to be one, anywhere but in
the registry and the files of ``READS_ALLOWED`` (which may only shrink).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tideflow.settings_registry import BY_NAME, READERS, SETTINGS, ConfigError, Setting

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("tideflow", "operators", "plugins", "dags")
REGISTRY = REPO / "tideflow" / "settings_registry"
NAME = re.compile(r"TIDEFLOW_[A-Z0-9_]+")
# Files that still read TIDEFLOW_* variables themselves (being rewritten elsewhere):
# their variables are declared; their reads move to the registry's accessors later.
READS_ALLOWED = {
    "tideflow/stack/cluster/build.py",
}


def sources() -> list[Path]:
    return sorted(
        path
        for top in SCANNED
        for path in (REPO / top).rglob("*.py")
        if REGISTRY not in path.parents
    )


def test_every_tideflow_name_in_the_code_is_declared() -> None:
    unknown: dict[str, set[str]] = {}
    for path in sources():
        for name in NAME.findall(path.read_text(encoding="utf-8")):
            # a prefix ("TIDEFLOW_K8S_*" in prose, f"TIDEFLOW_BROKER_{x}") names a family
            known = (
                any(n.startswith(name) for n in BY_NAME)
                if name.endswith("_")
                else (name in BY_NAME)
            )
            if not known:
                unknown.setdefault(name, set()).add(str(path.relative_to(REPO)))
    assert unknown == {}


def _constants(tree: ast.Module) -> dict[str, str]:
    return {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


@functools.cache
def _every_constant() -> dict[str, str]:
    """Module-level string constants across the code (an imported ``X_ENV`` resolves)."""
    found: dict[str, str] = {}
    for path in sources():
        found.update(_constants(ast.parse(path.read_text(encoding="utf-8"))))
    return found


def _reads_environ(node: ast.AST, aliases: set[str]) -> ast.expr | None:
    """The key of an environment read (``os.environ.get(k)``, ``os.getenv(k)``,
    ``os.environ[k]``, ``env.get(k)`` or ``env(k)`` for an alias), else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        seen = ast.unparse(node.value)
        if "environ" in seen or seen in aliases:
            return node.slice
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        seen = ast.unparse(func)
        if isinstance(func, ast.Attribute) and func.attr in ("get", "getenv"):
            target = ast.unparse(func.value)
            if "environ" in target or target == "os" or target in aliases:
                return node.args[0]
        if isinstance(func, ast.Name) and seen in aliases:
            return node.args[0]
    return None


def _tideflow_key(key: ast.expr, constants: dict[str, str]) -> bool:
    """Whether ``key`` is, or may be, a TIDEFLOW_* name (a value we cannot resolve may)."""
    if isinstance(key, ast.Constant):
        return isinstance(key.value, str) and key.value.startswith("TIDEFLOW_")
    if isinstance(key, ast.JoinedStr):
        first = key.values[0] if key.values else None
        return not (isinstance(first, ast.Constant) and not str(first.value).startswith("T"))
    name = key.id if isinstance(key, ast.Name) else getattr(key, "attr", None)
    return name not in constants or constants[name].startswith("TIDEFLOW_")


def environ_reads(path: Path, constants: dict[str, str], shown: str = "") -> list[str]:
    source = path.read_text(encoding="utf-8")
    shown = shown or str(path.relative_to(REPO))
    tree = ast.parse(source)
    local = {**constants, **_constants(tree)}
    aliases = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and "environ" in (ast.unparse(node.value))
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return [
        f"{shown}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if (key := _reads_environ(node, aliases)) is not None and _tideflow_key(key, local)
    ]


def test_no_tideflow_variable_is_read_outside_the_registry() -> None:
    constants = _every_constant()
    reads = [
        read
        for path in sources()
        if str(path.relative_to(REPO)) not in READS_ALLOWED
        for read in environ_reads(path, constants)
    ]
    assert reads == []


@pytest.mark.parametrize("allowed", sorted(READS_ALLOWED))
def test_the_allow_list_only_names_files_that_still_read(allowed: str) -> None:
    """A file routed through the registry leaves the list (it may only shrink)."""
    assert environ_reads(REPO / allowed, _every_constant()), f"{allowed}: drop it from the list"


def test_the_scan_finds_the_reads_it_is_for(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "import os\nX_ENV = 'TIDEFLOW_X'\nenv = os.environ.get\n"
        "a = os.environ.get('TIDEFLOW_A')\nb = os.getenv(X_ENV)\nc = os.environ['TIDEFLOW_C']\n"
        "d = env('TIDEFLOW_D')\ne = os.environ.get(f'TIDEFLOW_{a}')\nf = os.environ.get('RANK')\n"
    )
    reads = environ_reads(module, {}, "probe.py")
    assert [r.split(": ", 1)[1][:22] for r in reads] == [
        "os.environ.get('TIDEFL",
        "os.getenv(X_ENV)",
        "os.environ['TIDEFLOW_C",
        "env('TIDEFLOW_D')",
        "os.environ.get(f'TIDEF",
    ]


def test_each_declaration_is_whole() -> None:
    for setting in SETTINGS:
        assert setting.name.startswith("TIDEFLOW_") and setting.help and setting.accepted
        assert set(setting.readers) <= set(READERS) and setting.readers, setting.name
        assert set(setting.defaults) == {"local", "kubernetes"}
        if setting.default is not None:
            setting.check(setting.default)  # a default its own check refuses is a typo


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TIDEFLOW_BACKEND", "nomad"),
        ("TIDEFLOW_BROKER_SENSE_S", "abc"),
        ("TIDEFLOW_BROKER_POLL_S", "0"),
        ("TIDEFLOW_KEEP_LAST", "-1"),
        ("TIDEFLOW_EMULATED", "yes"),
        ("TIDEFLOW_K8S_GRACE_S", "1e400"),
        ("TIDEFLOW_BROKER_LATENCY_SLO_SHARE", "1"),
        ("TIDEFLOW_ARTIFACT_ROOT", "ftp://host/x"),  # no store of that scheme exists
        ("TIDEFLOW_CHECKPOINT_URI", "bucket/ckpt"),
    ],
)
def test_a_refused_value_is_named_with_what_is_accepted(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    from tideflow import settings_registry as registry

    setting: Setting = BY_NAME[name]
    monkeypatch.setenv(name, value)
    read = {"number": registry.number, "whole": registry.whole, "flag": registry.flag}.get(
        setting.kind, registry.text
    )
    with pytest.raises(ConfigError) as refused:
        read(name)
    assert str(refused.value) == f"{name}={value!r}: accepted: {setting.accepted}"


def test_the_kubernetes_defaults_are_stated() -> None:
    assert BY_NAME["TIDEFLOW_ARTIFACT_ROOT"].defaults == {
        "local": "file://$TIDEFLOW_HOME/artifacts",
        "kubernetes": "s3://tideflow/artifacts",
    }
    assert (
        "http://mlflow.tideflow:5000" in BY_NAME["TIDEFLOW_K8S_MLFLOW_URI"].defaults["kubernetes"]
    )


def test_an_undeclared_name_is_a_programming_error() -> None:
    from tideflow import settings_registry as registry

    with pytest.raises(KeyError, match="TIDEFLOW_NOPE is not a declared setting"):
        registry.raw("TIDEFLOW_NOPE")


def test_the_kubernetes_defaults_are_kube_settings_own() -> None:
    """Unset, every TIDEFLOW_K8S_* reads as ``KubeSettings``' default (one source)."""
    from tideflow.kube.settings import KubeSettings, kube_settings_from_env

    assert kube_settings_from_env({}) == KubeSettings()
