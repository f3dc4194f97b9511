"""The default image tag is the package version, in the code and in deploy/.

pyproject.toml's version is the one source: ``tideflow.version`` reads it from
the installed package's metadata, the settings registry's default image
(``TIDEFLOW_K8S_IMAGE``) and ``KubeSettings`` tag with it, and the manifests
and Helm values under deploy/ name the same tag (a release edits them with the
version; this test says where they disagree).
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import yaml

import tideflow
from tideflow.kube.settings import KubeSettings, kube_settings_from_env
from tideflow.settings_registry.declared_kubernetes import DEFAULT_IMAGE

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
HELM_VALUES = DEPLOY / "helm" / "airflow-values.yaml"
# tideflow's own images; tideflow-mlflow is tagged with MLflow's version.
OWN_IMAGE = re.compile(r"registry\.example\.com/tideflow(?:-airflow)?:([^\s\"',]+)")


def package_version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def test_the_installed_version_is_pyprojects() -> None:
    """A stale install (pip install -e . not rerun after a bump) fails here."""
    assert version("tideflow") == tideflow.__version__ == package_version()


def test_the_default_image_is_tagged_with_the_package_version() -> None:
    expected = f"registry.example.com/tideflow:{package_version()}"
    assert expected == DEFAULT_IMAGE
    assert KubeSettings().image == expected
    assert kube_settings_from_env({}).image == expected


def test_deploy_names_the_package_version_for_tideflows_images() -> None:
    tags = {
        f"{path.relative_to(REPO)}:{number}": match.group(1)
        for path in sorted(DEPLOY.rglob("*.y*ml"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for match in OWN_IMAGE.finditer(line)
    }
    assert "deploy/kubernetes/broker.yaml" in " ".join(tags)
    stale = {where: tag for where, tag in tags.items() if tag != package_version()}
    assert not stale, f"set these image tags to {package_version()}: {stale}"


def test_the_helm_values_tag_every_image_with_the_package_version() -> None:
    values = yaml.safe_load(HELM_VALUES.read_text())
    k8s_image = next(e["value"] for e in values["env"] if e["name"] == "TIDEFLOW_K8S_IMAGE")
    assert {
        "defaultAirflowTag": values["defaultAirflowTag"],
        "images.airflow.tag": values["images"]["airflow"]["tag"],
        "env TIDEFLOW_K8S_IMAGE": k8s_image.rpartition(":")[2],
    } == dict.fromkeys(
        ("defaultAirflowTag", "images.airflow.tag", "env TIDEFLOW_K8S_IMAGE"), package_version()
    )
