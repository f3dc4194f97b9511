"""``make cluster-pin``: write each Go module of ours from ``versions.env`` and tidy it.

The module requires the pinned version of its component; ``go mod tidy`` then
pins everything below it in go.sum. k8s.io/kubernetes names its staging
modules (k8s.io/api, k8s.io/apiserver, ...) at v0.0.0 and replaces them by
folders of its own repository, so our module replaces each by the version
published with the same release (v1.X.Y -> v0.X.Y).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tideflow.stack.cluster.build import COMPONENTS, MODULES, Component, versions
from tideflow.stack.processes import StackError

GO_DIRECTIVE = "go 1.25.0"


def _go(args: list[str], cwd: Path) -> str:
    done = subprocess.run(["go", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StackError(f"go {' '.join(args)} failed in {cwd}:\n{done.stderr[-4000:]}")
    return done.stdout


def _staging_replaces(version: str, cwd: Path) -> list[str]:
    info = json.loads(_go(["mod", "download", "-json", f"k8s.io/kubernetes@{version}"], cwd))
    text = Path(info["GoMod"]).read_text()
    staging = re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/", text, re.M)
    published = "v0." + version.split(".", 1)[1]
    return [f"\t{name} => {name} {published}" for name in staging]


def write_module(component: Component, version: str) -> None:
    folder = MODULES / component.name
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        f"// Builds {component.name} from its published module (see deploy/cluster/versions.env).",
        f"module tideflow.local/cluster/{component.name}",
        "",
        GO_DIRECTIVE,
        "",
        f"require {component.module} {version}",
    ]
    if component.name == "kubernetes":
        lines += ["", "replace (", *_staging_replaces(version, folder), ")"]
    (folder / "go.mod").write_text("\n".join(lines) + "\n")
    imports = "".join(f'\t_ "{package}"\n' for package in component.commands.values())
    (folder / "tools.go").write_text(
        "//go:build tools\n\n"
        "// Package tools names the commands this module builds; the build tag\n"
        f"// keeps it out of every build.\npackage tools\n\nimport (\n{imports})\n"
    )
    _go(["mod", "tidy"], folder)


def main() -> int:
    pinned = versions()
    for component in COMPONENTS:
        write_module(component, pinned[component.name])
        print(f"{component.name} {pinned[component.name]}: {MODULES / component.name}/go.mod")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
