"""Build the control plane's commands from their published Go modules, once per version.

``deploy/cluster/versions.env`` pins every version; ``deploy/cluster/modules/<name>``
is a small Go module of ours that requires that version (its go.sum pins the
rest). Binaries go to a cache outside the checkout, keyed by the module's
go.mod and go.sum, so a fresh clone on the same machine reuses them.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tideflow.stack.processes import StackError
from tideflow.stack.services import REPO

CLUSTER_DIR = REPO / "deploy" / "cluster"
VERSIONS = CLUSTER_DIR / "versions.env"
MODULES = CLUSTER_DIR / "modules"


@dataclass(frozen=True)
class Component:
    name: str
    module: str
    # binary name -> Go package that builds it
    commands: dict[str, str]
    # what the binaries report as their version (`-X` link flags): Go variable ->
    # value, with {version}, {major} and {minor} filled in
    stamps: tuple[tuple[str, str], ...] = ()


COMPONENTS = (
    Component(
        "kubernetes",
        "k8s.io/kubernetes",
        {
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
        },
        tuple(
            (f"k8s.io/{package}.{field}", value)
            for package in ("component-base/version", "client-go/pkg/version")
            for field, value in (
                ("gitVersion", "{version}"),
                ("gitMajor", "{major}"),
                ("gitMinor", "{minor}"),
                ("gitTreeState", "clean"),
            )
        ),
    ),
    Component("etcd", "go.etcd.io/etcd/server/v3", {"etcd": "go.etcd.io/etcd/server/v3"}),
    Component(
        "kueue",
        "sigs.k8s.io/kueue",
        {"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
        (("sigs.k8s.io/kueue/pkg/version.GitVersion", "{version}"),),
    ),
    Component("jobset", "sigs.k8s.io/jobset", {"jobset": "sigs.k8s.io/jobset"}),
    Component("kwok", "sigs.k8s.io/kwok", {"kwok": "sigs.k8s.io/kwok/cmd/kwok"}),
)


def versions(path: Path = VERSIONS) -> dict[str, str]:
    pinned: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("=")
        if not sep or not re.fullmatch(r"v\d+\.\d+\.\d+", version.strip()):
            raise StackError(f"{path}:{number}: expected name=vX.Y.Z, got {line!r}")
        pinned[name.strip()] = version.strip()
    return pinned


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("TIDEFLOW_CLUSTER_CACHE", Path(base) / "tideflow" / "cluster"))


def _required(component: Component) -> str:
    text = (MODULES / component.name / "go.mod").read_text()
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(component.module)}\s+(v\S+)", text, re.M)
    if found is None:
        raise StackError(f"{MODULES / component.name}/go.mod does not require {component.module}")
    return found.group(1)


def binary_dir(component: Component, version: str) -> Path:
    module = MODULES / component.name
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update((module / name).read_bytes())
    return cache_root() / f"{component.name}-{version}-{digest.hexdigest()[:12]}"


def build(component: Component, version: str, say: Callable[[str], None] = print) -> Path:
    """The folder holding ``component``'s binaries, built now if the cache lacks them."""
    required = _required(component)
    if required != version:
        raise StackError(
            f"{VERSIONS} pins {component.name}={version} but {MODULES / component.name}/go.mod "
            f"requires {component.module} {required}; run `make cluster-pin`"
        )
    target = binary_dir(component, version)
    if (target / ".complete").exists():
        return target
    if shutil.which("go") is None:
        raise StackError("building the local control plane needs Go (`go` is not on PATH)")
    target.mkdir(parents=True, exist_ok=True)
    major, minor = version.lstrip("v").split(".")[:2]
    stamp = " ".join(
        f"-X {var}={value.format(version=version, major=major, minor=minor)}"
        for var, value in component.stamps
    )
    started = time.monotonic()
    for binary, package in component.commands.items():
        say(f"building {binary} {version} (cached in {target}) ...")
        command = ["go", "build", f"-ldflags=-s -w {stamp}", "-o", str(target / binary), package]
        done = subprocess.run(
            command, cwd=MODULES / component.name, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise StackError(f"go build {package} failed:\n{done.stderr[-4000:]}")
    (target / ".complete").write_text(f"{time.monotonic() - started:.0f}s\n")
    return target


def build_all(say: Callable[[str], None] = print) -> dict[str, Path]:
    pinned = versions()
    missing = [c.name for c in COMPONENTS if c.name not in pinned]
    if missing:
        raise StackError(f"{VERSIONS} pins no version for {', '.join(missing)}")
    return {c.name: build(c, pinned[c.name], say) for c in COMPONENTS}


def main() -> int:
    """``make cluster-build``: every binary of the control plane, built where not cached."""
    try:
        built = build_all(lambda line: print(line, flush=True))
    except StackError as exc:
        print(f"error: {exc}")
        return 1
    for name, folder in built.items():
        print(f"{name}: {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
