"""deploy/: every manifest validates offline and agrees with the code that uses it.

* Core objects validate strictly against the Kubernetes API schema
  (kubernetes-validate: misspelled fields fail); Volcano and Kueue objects against
  their CRD schemas (read from ../shared/schemas; those tests skip without it).
* The broker, MLflow and gang pods meet the "restricted" Pod Security Standard;
  RBAC grants exactly what the broker's actuator and the gang operator call.
* Kueue's ClusterQueue is the one the broker patches, in the flavor and resource
  it patches; the patched object still validates.
* The Helm values for the Airflow chart use only keys the chart has, set what
  tideflow needs, and their Kubernetes fragments validate inside a Pod.
* Nothing secret is written anywhere in deploy/: only references to Secrets.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import ipaddress
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kubefake import KubeFake
from tests.kubefake.schemas import SCHEMAS, crd_schema, validate
from tests.vap_cel import evaluate

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
VALUES = REPO / "deploy" / "helm" / "airflow-values.yaml"
GUIDE = REPO / "docs" / "how-to" / "deploy-kubernetes.md"
K8S_VERSION = "1.33"


def objects() -> list[dict[str, Any]]:
    """Every object of deploy/kubernetes, a fresh copy for the caller to change."""
    found: list[dict[str, Any]] = json.loads(_objects_as_json())
    return found


@functools.cache
def _objects_as_json() -> str:
    # parsed once per process: the network-policy tests ask for them 60 times each
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        found += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return json.dumps(found)


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [o for o in objects() if o["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in by_kind(kind) if o["metadata"]["name"] == name]
    return found


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(VALUES.read_text())
    return loaded


LAB_CLUSTER = REPO / "deploy" / "local" / "lab-cluster.yaml"
# kwok's stage for a Job's pod ending, loaded by the local cluster (tests/cluster use it)
KWOK_STAGE = REPO / "deploy" / "cluster" / "kwok-pod-complete.yaml"


def test_every_yaml_file_in_deploy_is_checked_here() -> None:
    checked = set(DEPLOY.glob("*.yaml")) | {VALUES, LAB_CLUSTER, KWOK_STAGE}
    found = set((REPO / "deploy").rglob("*.yaml")) | set((REPO / "deploy").rglob("*.yml"))
    assert found == checked, sorted(str(p.relative_to(REPO)) for p in found ^ checked)


# -- Pod Security Standard "restricted" --------------------------------------------------


def restricted_problems(pod: dict[str, Any]) -> list[str]:
    """What keeps a pod spec from the "restricted" Pod Security Standard (its main points)."""
    problems = []
    context = pod.get("securityContext") or {}
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
        problems.append("host namespaces")
    if context.get("runAsUser") == 0:
        problems.append("pod runs as root")
    for container in pod.get("initContainers", []) + pod["containers"]:
        own = container.get("securityContext") or {}
        name = container["name"]
        if own.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if own.get("capabilities", {}).get("drop") != ["ALL"]:
            problems.append(f"{name}: capabilities not dropped")
        if own.get("privileged"):
            problems.append(f"{name}: privileged")
        if not (own.get("runAsNonRoot") or context.get("runAsNonRoot")):
            problems.append(f"{name}: may run as root")
        if own.get("runAsUser") == 0:
            problems.append(f"{name}: runs as root")
        seccomp = own.get("seccompProfile") or context.get("seccompProfile") or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: no seccomp profile")
    return problems


def test_the_restricted_check_can_fail() -> None:
    pod = {"containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False}}]}
    assert len(restricted_problems(pod)) == 3


def test_broker_pod_meets_the_restricted_pod_security_standard() -> None:
    deployment = named("Deployment", "tideflow-broker")
    assert restricted_problems(deployment["spec"]["template"]["spec"]) == []
    assert deployment["spec"]["replicas"] == 1  # one decision-maker


def test_mlflow_pod_meets_the_restricted_pod_security_standard() -> None:
    pod = named("Deployment", "mlflow")["spec"]["template"]["spec"]
    assert restricted_problems(pod) == []
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_gang_pods_meet_the_restricted_pod_security_standard() -> None:
    from tideflow.kube import KubeSettings
    from tideflow.kube.torchrun import VOLCANO
    from tideflow.kube.volcano import gang_pod_spec

    for device_class in ("cpu", "gpu", "npu"):
        pod = gang_pod_spec(
            gang("vision", device_class), KubeSettings(), master_addr="m", index=VOLCANO, run_id="g"
        )
        assert restricted_problems(pod) == [], device_class


def test_the_namespace_enforces_the_restricted_pod_security_standard() -> None:
    # Pod Security admission reads these labels; "enforce" refuses a pod that falls
    # short, "warn" and "audit" only report it (Kubernetes documentation, "Enforce
    # Pod Security Standards with Namespace Labels").
    labels = named("Namespace", "tideflow")["metadata"]["labels"]
    for mode in ("enforce", "warn", "audit"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted", mode


def emitted_pods() -> dict[str, dict[str, Any]]:
    """Every pod template tideflow emits, by where it comes from: metadata and spec.

    Gang pods as a Volcano Job and as a JobSet (an Argo workflow's gang driver builds
    the same ones), the Argo WorkflowTemplate's container steps (the parts tideflow
    sets: Argo adds its own executor containers) and the Airflow task pods' overrides.
    """
    from tideflow.argo import compile_pipeline
    from tideflow.compile.dag_plan import compile_dag_plan
    from tideflow.kube import KubeSettings
    from tideflow.kube.jobset import gang_jobset
    from tideflow.kube.pods import task_pod
    from tideflow.kube.volcano import gang_volcano_job
    from tideflow.spec import load_pipeline

    settings = KubeSettings()
    found: dict[str, dict[str, Any]] = {}
    for device_class in ("cpu", "gpu", "npu"):
        shape = gang("vision", device_class)
        job = gang_volcano_job(shape, "p/r/train", settings)
        found[f"volcano-{device_class}"] = job["spec"]["tasks"][0]["template"]
        jobset = gang_jobset(shape, "p/r/train", KubeSettings(gang_scheduler="kueue"))
        template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        found[f"jobset-{device_class}"] = template
    digits = REPO / "pipelines" / "digits.yaml"
    workflow = yaml.safe_load(compile_pipeline(digits, settings=settings)[1])
    for template in workflow["spec"]["templates"]:
        if "container" in template:
            spec = {"containers": [{"name": "main", **template["container"]}]}
            if "securityContext" in template:
                spec["securityContext"] = template["securityContext"]
            found[f"argo-{template['name']}"] = {"metadata": template["metadata"], "spec": spec}
    for task in compile_dag_plan(load_pipeline(digits)).tasks:
        found[f"airflow-{task.task_id}"] = task_pod(task, settings, None)
    return found


def test_every_pod_tideflow_emits_meets_the_restricted_pod_security_standard() -> None:
    pods = emitted_pods()
    assert {"volcano-gpu", "jobset-gpu", "argo-evaluate", "argo-train", "airflow-train"} <= (
        set(pods)
    )
    for name, pod in pods.items():
        assert restricted_problems(pod["spec"]) == [], name


# Restricted allows only these volume types (Kubernetes documentation, "Pod Security
# Standards", Restricted: "Volume Types").
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def test_every_volume_in_deploy_is_one_restricted_allows() -> None:
    for obj in by_kind("Deployment"):
        for volume in obj["spec"]["template"]["spec"].get("volumes", []):
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, volume


def test_helm_values_make_every_airflow_container_restricted() -> None:
    """The chart's helper containers (wait-for-migrations, log groomers, the migration
    job) take the global ``securityContexts``; statsd takes only its own.

    upstream: apache/airflow chart/templates/_helpers.yaml "airflowPodSecurityContext"
    and "containerSecurityContext" fall back to ``securityContexts.pod`` and
    ``securityContexts.containers``; "localPodSecurityContext" and
    "externalContainerSecurityContext" (statsd) do not.
    """
    chart = values()
    pod_level = chart["securityContexts"]["pod"]
    container = chart["securityContexts"]["containers"]
    pod = {
        "securityContext": pod_level,
        "containers": [{"name": "x", "securityContext": container}],
    }
    assert restricted_problems(pod) == []
    assert pod_level["runAsNonRoot"] is True
    for component in ("workers", "scheduler", "dagProcessor", "triggerer", "apiServer"):
        contexts = chart[component].get("securityContexts", {})
        one = {
            "securityContext": contexts.get("pod", pod_level),
            "containers": [
                {"name": component, "securityContext": contexts.get("container", container)}
            ],
        }
        assert restricted_problems(one) == [], component
    statsd = chart["statsd"]
    if statsd.get("enabled", True):  # on by default in the chart
        contexts = statsd["securityContexts"]
        one = {
            "securityContext": contexts["pod"],
            "containers": [{"name": "statsd", "securityContext": contexts["container"]}],
        }
        assert restricted_problems(one) == []
        # The statsd-exporter image's user is a name, which runAsNonRoot cannot check.
        assert contexts["pod"]["runAsUser"] > 0


# -- RBAC -------------------------------------------------------------------------------


def rules(kind: str, *names: str) -> list[dict[str, Any]]:
    return [
        rule
        for role in by_kind(kind)
        if not names or role["metadata"]["name"] in names
        for rule in role["rules"]
    ]


def grants(every: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in every
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_no_role_has_wildcards_or_secrets() -> None:
    for rule in rules("Role") + rules("ClusterRole"):
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "*" not in rule["apiGroups"]
        assert "secrets" not in rule["resources"]


def test_broker_rbac_is_least_privilege_and_covers_the_actuator() -> None:
    from tideflow.broker.kubernetes import target_from_env

    every = rules("Role", "tideflow-broker") + rules("ClusterRole", "tideflow-broker")
    needed = {
        ("", "pods", "list"),
        ("", "pods/eviction", "create"),
        ("apps", "deployments/scale", "patch"),
        ("autoscaling", "horizontalpodautoscalers", "patch"),
        ("", "nodes", "list"),
        ("", "nodes", "patch"),
        ("scheduling.volcano.sh", "queues", "patch"),
        ("kueue.x-k8s.io", "clusterqueues", "get"),
        ("kueue.x-k8s.io", "clusterqueues", "patch"),
        ("kueue.x-k8s.io", "workloads", "list"),
    }
    assert needed <= grants(every), needed - grants(every)
    # Pods, evictions and scaling stay namespaced: never granted cluster-wide.
    cluster_rules = rules("ClusterRole", "tideflow-broker")
    cluster_wide = {r for rule in cluster_rules for r in rule["resources"]}
    assert cluster_wide == {"nodes", "queues", "clusterqueues"}
    # The queue the broker patches by default is the one its role names.
    queue = target_from_env().training_queue
    for rule in cluster_rules:
        if rule["resources"] in (["queues"], ["clusterqueues"]):
            assert rule["resourceNames"] == [queue]


def test_airflow_roles_grant_exactly_what_the_gang_operator_and_trigger_call() -> None:
    from tideflow.backends.kubernetes import GANG_KINDS

    objects_ = {(kind.group, kind.plural) for kind in GANG_KINDS.values()}
    launcher = grants(rules("Role", "tideflow-gang-launcher"))
    watcher = grants(rules("Role", "tideflow-gang-watcher"))
    # Submit looks the object up by name, then creates it once (replacing a preempted or
    # failed one: delete); the trigger lists and watches it (backends.kubernetes.follow)
    # and deletes it when the task is killed.
    verbs = ("get", "create", "delete")
    assert launcher == {(g, p, verb) for g, p in objects_ for verb in verbs}
    assert watcher == {(g, p, verb) for g, p in objects_ for verb in ("list", "watch", "delete")}
    subjects = {
        b["roleRef"]["name"]: {s["name"] for s in b["subjects"]} for b in by_kind("RoleBinding")
    }
    chart = values()
    assert subjects["tideflow-gang-launcher"] == {chart["workers"]["serviceAccount"]["name"]}
    assert subjects["tideflow-gang-watcher"] == {chart["triggerer"]["serviceAccount"]["name"]}


def bound_service_accounts() -> set[str]:
    return {
        s["name"]
        for b in by_kind("RoleBinding") + by_kind("ClusterRoleBinding")
        for s in b["subjects"]
        if s["kind"] == "ServiceAccount"
    }


def test_gang_pods_run_as_their_own_service_account_without_a_token() -> None:
    from tideflow.kube import KubeSettings
    from tideflow.kube.torchrun import VOLCANO
    from tideflow.kube.volcano import gang_pod_spec

    settings = KubeSettings()
    account = named("ServiceAccount", settings.gang_service_account)
    assert account["automountServiceAccountToken"] is False
    assert settings.gang_service_account not in bound_service_accounts()  # no API rights
    for name, pod in emitted_pods().items():
        if name.startswith(("volcano", "jobset")) or name.endswith("-gang"):
            assert pod["spec"]["serviceAccountName"] == settings.gang_service_account, name
            assert pod["spec"]["automountServiceAccountToken"] is False, name
    pod = gang_pod_spec(
        gang("vision", "gpu"),
        KubeSettings(gang_service_account="x"),
        master_addr="m",
        index=VOLCANO,
        run_id="g",
    )
    assert pod["serviceAccountName"] == "x"


def test_argo_workflow_pods_mount_no_token_and_its_executor_may_do_only_what_argo_needs() -> None:
    """Workflow pods run as one ServiceAccount with no token mounted; Argo mounts the
    executor ServiceAccount's token into its own containers only.

    upstream: Argo's workflowpod.go setupServiceAccount/newExecContainer (the executor
    token volume, mounted in the executor containers only; automountServiceAccountToken
    false needs executor.serviceAccountName); argo workflow/validate/validate.go (the
    same rule); Argo's quick-start emissary executor Role (workflowtaskresults: create,
    patch) and docs/service-account-secrets.md (the executor token Secret is found by
    the name <account>.service-account-token). The executor creates nothing: the gang
    step's driver does, as its own ServiceAccount (tests/pipelines/test_argo_gang_step.py shows
    that account's grants suffice).
    """
    from tideflow.kube import KubeSettings

    settings = KubeSettings()
    workflow = named("ServiceAccount", settings.argo_service_account)
    executor = named("ServiceAccount", settings.argo_executor_service_account)
    assert workflow["automountServiceAccountToken"] is False
    assert executor["automountServiceAccountToken"] is False
    token = named("Secret", f"{settings.argo_executor_service_account}.service-account-token")
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": settings.argo_executor_service_account
    }
    assert "data" not in token and "stringData" not in token  # the token controller fills it
    role = rules("Role", "tideflow-argo-executor")
    assert grants(role) == {
        ("argoproj.io", "workflowtaskresults", "create"),
        ("argoproj.io", "workflowtaskresults", "patch"),
    }
    subjects = {
        b["roleRef"]["name"]: {s["name"] for s in b["subjects"]} for b in by_kind("RoleBinding")
    }
    assert subjects["tideflow-argo-executor"] == {settings.argo_executor_service_account}
    assert settings.argo_service_account not in bound_service_accounts()


# -- What the broker may change on a node ------------------------------------------------

BROKER = "system:serviceaccount:tideflow:tideflow-broker"


def node_policy() -> dict[str, Any]:
    return named("ValidatingAdmissionPolicy", "tideflow-broker-nodes")


def gpu_node() -> dict[str, Any]:
    """A GPU node of the training pool, as the API server returns it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-1",
            "labels": {
                "kubernetes.io/hostname": "gpu-1",
                "nvidia.com/gpu.present": "true",
                "tideflow.io/pool": "training",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "podCIDRs": ["10.244.1.0/24"],
            "providerID": "aws:///eu-west-1a/i-0123",
            "taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": "tideflow.io/pool", "value": "training", "effect": "NoSchedule"},
                {
                    "key": "node.kubernetes.io/unreachable",
                    "effect": "NoExecute",
                    "timeAdded": "2026-11-23T06:00:00Z",
                },
            ],
        },
    }


def changed(change: Any) -> dict[str, Any]:
    node = gpu_node()
    change(node)
    return node


def moved_to(pool: str) -> Any:
    def change(node: dict[str, Any]) -> None:
        node["metadata"]["labels"]["tideflow.io/pool"] = pool
        taints = [t for t in node["spec"]["taints"] if t["key"] != "tideflow.io/pool"]
        node["spec"]["taints"] = [
            *taints,
            {"key": "tideflow.io/pool", "value": pool, "effect": "NoSchedule"},
        ]

    return change


def test_a_validating_admission_policy_limits_the_brokers_node_patches() -> None:
    """RBAC grants verbs on resources, never fields: the broker's ClusterRole may patch
    any field of any node, so a ValidatingAdmissionPolicy (GA in Kubernetes 1.30,
    admissionregistration.k8s.io/v1) refuses every change but the pool label and taint.
    """
    policy = node_policy()
    binding = named("ValidatingAdmissionPolicyBinding", "tideflow-broker-nodes")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every node
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule == {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["UPDATE"],
        "resources": ["nodes"],
    }
    # A patch is an UPDATE; the role grants no verb that creates or deletes a node,
    # and not the nodes/status subresource (which a "nodes" rule does not match).
    node_verbs = {
        verb
        for rule in rules("ClusterRole", "tideflow-broker")
        for resource in rule["resources"]
        if resource.startswith("nodes")
        for verb in rule["verbs"]
    }
    assert node_verbs == {"get", "list", "watch", "patch"}
    # A ServiceAccount's user name is system:serviceaccount:NAMESPACE:NAME (Kubernetes
    # documentation, "Service Accounts").
    account = named("ServiceAccount", "tideflow-broker")["metadata"]
    assert f"system:serviceaccount:{account['namespace']}:{account['name']}" == BROKER
    node = gpu_node()
    assert evaluate(policy, old=node, new=node, username=BROKER) == []
    other = "system:serviceaccount:kube-system:node-controller"
    assert evaluate(policy, old=node, new=changed(moved_to("cpu")), username=other) is None


@pytest.mark.parametrize("pool", ["inference", "training"])
def test_the_node_policy_admits_moving_a_node_between_the_brokers_pools(pool: str) -> None:
    policy = node_policy()
    start = changed(moved_to("inference" if pool == "training" else "training"))
    assert evaluate(policy, old=start, new=changed(moved_to(pool)), username=BROKER) == []

    # A node the broker has never moved: no pool label or taint yet.
    def unlabelled(node: dict[str, Any]) -> None:
        node["metadata"]["labels"].pop("tideflow.io/pool")
        node["spec"]["taints"] = node["spec"]["taints"][:1] + node["spec"]["taints"][2:]

    assert (
        evaluate(policy, old=changed(unlabelled), new=changed(moved_to(pool)), username=BROKER)
        == []
    )


def _set(*path: str, to: Any) -> Any:
    """A change that sets the field at ``path`` (keys: label keys hold dots) to ``to``,
    or removes it (None)."""

    def change(node: dict[str, Any]) -> None:
        *parents, last = path
        target = node
        for part in parents:
            target = target.setdefault(part, {})
        if to is None:
            target.pop(last, None)
        else:
            target[last] = to

    return change


REFUSED = {
    "another label changed": _set("metadata", "labels", "kubernetes.io/hostname", to="evil"),
    "another label added": _set("metadata", "labels", "node-role.kubernetes.io/x", to="x"),
    "another label removed": _set("metadata", "labels", "nvidia.com/gpu.present", to=None),
    "an annotation added": _set("metadata", "annotations", "x", to="y"),
    "annotations removed": _set("metadata", "annotations", to=None),
    "a finalizer added": _set("metadata", "finalizers", to=["x"]),
    "an owner added": _set(
        "metadata",
        "ownerReferences",
        to=[{"apiVersion": "v1", "kind": "Node", "name": "x", "uid": "u"}],
    ),
    "cordoned": _set("spec", "unschedulable", to=True),
    "providerID changed": _set("spec", "providerID", to="aws:///x"),
    "podCIDR changed": _set("spec", "podCIDR", to="10.0.0.0/8"),
    "the pool label removed": _set("metadata", "labels", "tideflow.io/pool", to=None),
    "a pool the broker does not manage": moved_to("cpu"),
    "another taint removed": lambda n: n["spec"]["taints"].pop(0),
    "another taint added": lambda n: n["spec"]["taints"].append(
        {"key": "x", "value": "y", "effect": "NoSchedule"}
    ),
    "another taint's effect changed": lambda n: n["spec"]["taints"][0].update(
        {"effect": "NoExecute"}
    ),
    "another taint's time dropped": lambda n: n["spec"]["taints"][2].pop("timeAdded"),
    "the pool taint removed": lambda n: n["spec"]["taints"].pop(1),
    "the pool taint evicts": lambda n: n["spec"]["taints"][1].update({"effect": "NoExecute"}),
    "the pool taint names another pool": lambda n: n["spec"]["taints"][1].update(
        {"value": "inference"}
    ),
    "two pool taints": lambda n: n["spec"]["taints"].append(
        {"key": "tideflow.io/pool", "value": "training", "effect": "PreferNoSchedule"}
    ),
}


# The validation that refuses each change, by a word of its message.
REASONS = {
    "another label": "no label",
    "annotation": "no annotation",
    "finalizer": "no annotation",
    "owner": "no annotation",
    "cordoned": "nothing in a node's spec",
    "CIDR changed": "nothing in a node's spec",
    "providerID changed": "nothing in a node's spec",
    "another taint": "no taint",
    "pool taint": "one NoSchedule taint",
    "pool label removed": "inference and training pools only",
    "does not manage": "inference and training pools only",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_node_policy_refuses_every_other_change_by_the_broker(case: str) -> None:
    node = gpu_node()
    refused = evaluate(node_policy(), old=node, new=changed(REFUSED[case]), username=BROKER)
    (reason,) = [r for word, r in REASONS.items() if word in case]
    assert refused and any(reason in message for message in refused), (case, refused)


def test_the_node_policy_refuses_moving_a_node_of_another_pool() -> None:
    cpu = changed(moved_to("cpu"))
    assert evaluate(node_policy(), old=cpu, new=changed(moved_to("training")), username=BROKER)


def test_the_node_policy_compares_every_field_of_a_node_spec() -> None:
    """Each NodeSpec field of the Kubernetes API (but the taints) changed alone is refused,
    so a field a later release adds fails this test until the policy compares it."""
    import importlib.resources

    schema = importlib.resources.files("kubernetes_validate").joinpath(
        f"kubernetes-json-schema/v{K8S_VERSION}.0-local-strict/nodespec-v1.json"
    )
    fields = json.loads(schema.read_text())["properties"]
    assert {"unschedulable", "providerID", "taints"} <= set(fields)
    samples = {"string": "changed", "boolean": True, "array": ["changed"], "object": {"a": "b"}}
    for field, definition in sorted(fields.items()):
        if field == "taints":
            continue
        kind = definition.get("type", ["object"])
        kind = kind[0] if isinstance(kind, list) else kind
        new = changed(_set("spec", field, to=samples[kind]))
        assert evaluate(node_policy(), old=gpu_node(), new=new, username=BROKER), field


@pytest.fixture
def kube() -> Iterator[KubeFake]:
    """The one Kubernetes fake (tests/kubefake): the real client, deploy/'s RBAC and policy."""
    with KubeFake() as fake:
        fake.apply(DEPLOY / "broker-rbac.yaml", DEPLOY / "kueue-queues.yaml")
        yield fake


@pytest.mark.parametrize("pool", ["inference", "training"])
def test_the_brokers_own_node_patch_is_admitted(kube: KubeFake, pool: str) -> None:
    from kubernetes import client

    from tideflow.broker.kubernetes import MERGE, ClusterTarget, KubernetesActuator

    start = changed(moved_to("training" if pool == "inference" else "inference"))
    kube.create(start)
    api = kube.client(BROKER)
    node = client.CoreV1Api(api).read_node("gpu-1")  # what the broker's client reads
    KubernetesActuator(api, ClusterTarget())._set_pool(node, pool)
    (patch,) = [r for r in kube.requests_by(BROKER) if r.verb == "patch"]
    # admitted by the API's RBAC and by the ValidatingAdmissionPolicy above
    assert (patch.name, patch.content_type, patch.code) == ("gpu-1", MERGE, 200)
    patched = kube.get("v1", "Node", "gpu-1")
    assert patched["metadata"]["labels"]["tideflow.io/pool"] == pool
    assert evaluate(node_policy(), old=start, new=patched, username=BROKER) == []


# -- Network ----------------------------------------------------------------------------


def test_broker_accepts_no_connections() -> None:
    policy = named("NetworkPolicy", "tideflow-broker")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"] == []


# A small model of NetworkPolicy semantics (Kubernetes documentation, "Network
# Policies"): a pod selected by no policy of a direction is open in that direction;
# a selected pod accepts only what some selecting policy's rule allows (rules add
# up); a rule's peer with only a podSelector means pods of the policy's namespace, a
# namespaceSelector matches namespaces by their labels (kubernetes.io/metadata.name
# is set on every namespace), an ipBlock addresses outside the cluster; a rule with
# no ports allows every port. Label selectors: "Labels and Selectors".


@dataclass(frozen=True)
class Endpoint:
    labels: tuple[tuple[str, str], ...] = ()
    namespace: str | None = "tideflow"  # None: an address outside the cluster
    ip: str = "10.0.0.1"


def pod(labels: dict[str, str], namespace: str = "tideflow") -> Endpoint:
    return Endpoint(tuple(sorted(labels.items())), namespace)


OUTSIDE = Endpoint(namespace=None, ip="52.95.1.1")  # an S3 endpoint, the API server
KUBE_DNS = pod({"k8s-app": "kube-dns"}, "kube-system")
PROMETHEUS = pod({"app.kubernetes.io/name": "prometheus"}, "monitoring")


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        present = key in labels
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator == "In" and labels.get(key) not in expression["values"]:
            return False
        if operator == "NotIn" and present and labels[key] in expression["values"]:
            return False
    return True


def peer_matches(peer: dict[str, Any], policy_namespace: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        if other.namespace is not None:  # pods are addressed by selectors here
            return False
        block = peer["ipBlock"]
        address = ipaddress.ip_address(other.ip)
        inside = address in ipaddress.ip_network(block["cidr"])
        return inside and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    if other.namespace is None:
        return False
    if "namespaceSelector" in peer:
        names = {"kubernetes.io/metadata.name": other.namespace}
        if not selects(peer["namespaceSelector"], names):
            return False
    elif other.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector", {}), dict(other.labels))


def port_matches(rule: dict[str, Any], port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    if not ports:
        return True
    return any(
        p.get("protocol", "TCP") == protocol
        and p.get("port", port) <= port <= p.get("endPort", p.get("port", port))
        for p in ports
    )


def side_allows(
    policies: list[dict[str, Any]],
    own: Endpoint,
    *,
    other: Endpoint,
    direction: str,
    port: int,
    protocol: str,
) -> bool:
    if own.namespace is None:
        return True  # outside the cluster: no NetworkPolicy
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == own.namespace
        and direction in p["spec"].get("policyTypes", ["Ingress"])
        and selects(p["spec"]["podSelector"], dict(own.labels))
    ]
    if not selecting:
        return True
    key, peers = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    return any(
        port_matches(rule, port, protocol)
        and (
            peers not in rule
            or any(peer_matches(peer, p["metadata"]["namespace"], other) for peer in rule[peers])
        )
        for p in selecting
        for rule in p["spec"].get(key) or []
    )


def connects(
    source: Endpoint,
    target: Endpoint,
    port: int,
    protocol: str = "TCP",
    extra: list[dict[str, Any]] | None = None,
) -> bool:
    """Whether the NetworkPolicies in deploy/ (plus ``extra``) let source open port on target."""
    policies = by_kind("NetworkPolicy") + (extra or [])
    out = side_allows(
        policies, source, other=target, direction="Egress", port=port, protocol=protocol
    )
    into = side_allows(
        policies, target, other=source, direction="Ingress", port=port, protocol=protocol
    )
    return out and into


def mlflow_pod() -> Endpoint:
    return pod(named("Deployment", "mlflow")["spec"]["template"]["metadata"]["labels"])


def airflow_pod(component: str) -> Endpoint:
    """An Airflow pod as the chart labels it (tier, component, release) plus ``labels``."""
    chart = values()
    own = chart.get(component, {}).get("labels", {})
    return pod(
        {
            "tier": "airflow",
            "component": component,
            "release": "airflow",
            **chart.get("labels", {}),
            **own,
        }
    )


def emitted_endpoints() -> dict[str, Endpoint]:
    return {name: pod(p["metadata"].get("labels", {})) for name, p in emitted_pods().items()}


def test_the_network_model_can_fail() -> None:
    deny = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "deny", "namespace": "tideflow"},
        "spec": {"podSelector": {"matchLabels": {"a": "b"}}, "policyTypes": ["Ingress"]},
    }
    target = pod({"a": "b"})
    assert connects(pod({}), target, 80) and not connects(pod({}), target, 80, extra=[deny])
    assert not selects({"matchExpressions": [{"key": "k", "operator": "Exists"}]}, {})
    assert peer_matches({"ipBlock": {"cidr": "0.0.0.0/0"}}, "tideflow", OUTSIDE)
    assert not peer_matches({"podSelector": {}}, "tideflow", KUBE_DNS)


def test_mlflow_admits_only_tideflow_clients_on_its_port() -> None:
    from tideflow.kube.pods import MLFLOW_CLIENT_LABEL

    policy = named("NetworkPolicy", "mlflow")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= dict(mlflow_pod().labels).items()
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {MLFLOW_CLIENT_LABEL: "true"}}}]
    mlflow = mlflow_pod()
    # Every pod tideflow emits that reports to MLflow reaches it; Argo's resource step
    # only talks to the API server and is no client.
    clients = {
        name: endpoint for name, endpoint in emitted_endpoints().items() if name != "argo-train"
    }
    for name, endpoint in clients.items():
        assert connects(endpoint, mlflow, 5000), name
    for component in ("workers", "scheduler", "dagProcessor", "triggerer", "apiServer"):
        assert connects(airflow_pod(component), mlflow, 5000), component
    assert not connects(clients["volcano-gpu"], mlflow, 22)
    # Other pods of the namespace do not: an unlabelled one, or the broker (it never
    # calls MLflow).
    assert not connects(pod({"app": "something-else"}), mlflow, 5000)
    broker = named("Deployment", "tideflow-broker")["spec"]["template"]["metadata"]["labels"]
    assert not connects(pod(broker), mlflow, 5000)


def gang_endpoints() -> dict[str, Endpoint]:
    """Gang pods as their controllers label them: Volcano adds volcano.sh/job-name and
    job-namespace (upstream: volcano batch/v1alpha1 job.go JobNameKey), JobSet adds
    jobset.sigs.k8s.io/jobset-name (upstream: jobset_types.go JobSetNameKey)."""
    found = {}
    for name, endpoint in emitted_endpoints().items():
        labels = dict(endpoint.labels)
        if name.startswith("volcano") or name.endswith("-gang"):
            labels |= {"volcano.sh/job-name": "g", "volcano.sh/job-namespace": "tideflow"}
        elif name.startswith("jobset"):
            labels |= {"jobset.sigs.k8s.io/jobset-name": "g"}
        else:
            continue
        found[name] = pod(labels)
    return found


# The NetworkPolicy Volcano's svc plugin creates for each Job it runs: its pods admit
# each other (upstream: volcano pkg/controllers/job/plugins/svc/svc.go
# createNetworkPolicyIfNotExist, unless --disable-network-policy).
VOLCANO_JOB_POLICY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "g", "namespace": "tideflow"},
    "spec": {
        "podSelector": {
            "matchLabels": {"volcano.sh/job-name": "g", "volcano.sh/job-namespace": "tideflow"}
        },
        "ingress": [
            {
                "from": [
                    {
                        "podSelector": {
                            "matchLabels": {
                                "volcano.sh/job-name": "g",
                                "volcano.sh/job-namespace": "tideflow",
                            }
                        }
                    }
                ]
            }
        ],
        "policyTypes": ["Ingress"],
    },
}


def test_gang_pods_reach_each_other_mlflow_s3_and_dns_and_nothing_else() -> None:
    from tideflow.kube import KubeSettings

    port = KubeSettings().master_port
    gangs = gang_endpoints()
    assert {"volcano-gpu", "jobset-gpu"} <= set(gangs)
    volcano = [VOLCANO_JOB_POLICY]
    mlflow = mlflow_pod()
    task_pod_ = airflow_pod("workers")
    for name, worker in gangs.items():
        # Rendezvous on MASTER_PORT, and NCCL/Gloo on ports of their choosing.
        assert connects(worker, worker, port, extra=volcano), name
        assert connects(worker, worker, 40123, extra=volcano), name
        assert connects(worker, mlflow, 5000), name
        assert connects(worker, OUTSIDE, 443), name  # S3
        assert connects(worker, KUBE_DNS, 53, "UDP") and connects(worker, KUBE_DNS, 53), name
        # Nothing else reaches a gang worker, and it reaches nothing else.
        assert not connects(task_pod_, worker, port, extra=volcano), name
        assert not connects(pod({}), worker, port, extra=volcano), name
        assert not connects(worker, OUTSIDE, 22), name
        assert not connects(worker, airflow_pod("apiServer"), 8080), name
    # Volcano's plugin (on: no --disable-network-policy) admits a Job's own pods; the
    # JobSet policy admits JobSet gang pods.
    assert not connects(gangs["jobset-gpu"], gangs["volcano-gpu"], port, extra=volcano)
    job = KubeSettings()
    from tideflow.kube.volcano import gang_volcano_job

    assert gang_volcano_job(gang("vision", "gpu"), "p/r/t", job)["spec"]["plugins"]["svc"] == []


def test_airflow_pods_reach_what_airflow_needs_and_no_more() -> None:
    chart = values()
    labels = chart["labels"]
    policy = named("NetworkPolicy", "tideflow-airflow")
    assert selects(policy["spec"]["podSelector"], labels)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    mlflow = mlflow_pod()
    api_server, task, triggerer = (airflow_pod(c) for c in ("apiServer", "workers", "triggerer"))
    scheduler, statsd = airflow_pod("scheduler"), airflow_pod("statsd")
    chart_ports = chart.get("ports", {})
    api_port = chart_ports.get("apiServer", 8080)
    # Task pods call the API server's Execution API; the API server reads running
    # tasks' and the triggerer's logs from their log servers; everything reports to statsd.
    assert connects(task, api_server, api_port) and connects(triggerer, api_server, api_port)
    assert connects(api_server, task, chart_ports.get("workerLogs", 8793))
    assert connects(api_server, triggerer, chart_ports.get("triggererLogs", 8794))
    assert connects(scheduler, statsd, 9125, "UDP") and connects(PROMETHEUS, statsd, 9102)
    for component in (api_server, task, triggerer, scheduler):
        assert connects(component, mlflow, 5000)
        assert connects(component, KUBE_DNS, 53, "UDP")
        # The API server (443 or 6443), S3 and git over HTTPS (443), PostgreSQL (5432).
        for port in (443, 6443, 5432):
            assert connects(component, OUTSIDE, port), port
        assert not connects(component, OUTSIDE, 25)
    # Nothing else of the namespace reaches Airflow's pods.
    assert not connects(pod({}), api_server, api_port)
    for worker in gang_endpoints().values():
        assert not connects(worker, task, 8793)


def test_mlflow_serves_what_tideflow_is_told_to_use() -> None:
    deployment = named("Deployment", "mlflow")
    service = named("Service", "mlflow")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["mlflow", "server"]
    assert {"--host=0.0.0.0", "--port=5000", "--serve-artifacts"} <= set(command)
    assert any(arg.startswith("--artifacts-destination=s3://") for arg in command)
    # The backend store (with its password) comes from a Secret, never the command line.
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"]["key"] == "uri"
    assert not any("postgresql" in arg for arg in command)
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    assert service["spec"]["ports"][0]["port"] == 5000
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    # MLflow rejects Host headers it does not list; the address tideflow uses must be one.
    uri = chart_env()["MLFLOW_TRACKING_URI"]
    host = re.sub(r"^https?://", "", uri).rstrip("/")
    (allowed,) = [a for a in command if a.startswith("--allowed-hosts=")]
    assert host in allowed.split("=", 1)[1].split(",")
    assert host.split(".")[0] == service["metadata"]["name"]


# -- Schemas ----------------------------------------------------------------------------

CRDS = {
    ("scheduling.volcano.sh/v1beta1", "Queue"): ("volcano/scheduling.volcano.sh_queues.yaml",),
    ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"): ("kueue/kueue.x-k8s.io_resourceflavors.yaml",),
    ("kueue.x-k8s.io/v1beta2", "ClusterQueue"): ("kueue/kueue.x-k8s.io_clusterqueues.yaml",),
    ("kueue.x-k8s.io/v1beta2", "LocalQueue"): ("kueue/kueue.x-k8s.io_localqueues.yaml",),
    ("kueue.x-k8s.io/v1beta2", "Cohort"): ("kueue/kueue.x-k8s.io_cohorts.yaml",),
    ("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass"): (
        "kueue/kueue.x-k8s.io_workloadpriorityclasses.yaml",
    ),
}


def schema_for(obj: dict[str, Any]) -> dict[str, Any]:
    (relative,) = CRDS[(obj["apiVersion"], obj["kind"])]
    return crd_schema(relative, obj["apiVersion"].split("/")[1])


def is_crd(obj: dict[str, Any]) -> bool:
    return (obj["apiVersion"], obj["kind"]) in CRDS


def test_every_core_manifest_validates_strictly_against_the_kubernetes_schema() -> None:
    import kubernetes_validate

    core = [o for o in objects() if not is_crd(o)]
    assert {o["kind"] for o in core} >= {"Deployment", "Service", "NetworkPolicy", "Namespace"}
    for obj in core:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    broken = copy.deepcopy(named("Deployment", "mlflow"))
    broken["spec"]["replica"] = 1  # a misspelled field
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_every_object_is_either_core_or_a_known_crd() -> None:
    groups = {"scheduling.volcano.sh", "kueue.x-k8s.io", "batch.volcano.sh", "jobset.x-k8s.io"}
    for obj in objects():
        if obj["apiVersion"].split("/")[0] in groups:
            assert is_crd(obj), (obj["apiVersion"], obj["kind"])


def test_every_manifest_in_deploy_is_admitted_by_the_kubernetes_fake() -> None:
    """Applied in order (the namespace first) to the one Kubernetes fake, every object passes
    its admission: the core schemas, the CRD schemas and their CEL rules, the Volcano queue
    webhook and the Priority plugin. volcano-queues.yaml's team queues are refused by
    Volcano's webhook; tests/kube/test_kube_conformance.py holds that test."""
    with KubeFake(namespaces=()) as fake:
        created = fake.apply(DEPLOY / "namespace.yaml")
        for path in sorted(DEPLOY.glob("*.yaml")):
            if path.name not in ("namespace.yaml", "volcano-queues.yaml"):
                created += fake.apply(path)  # raises ApiError for a refused object
    expected = [o for o in objects() if o["kind"] != "Queue"]
    assert len(created) == len(expected)


CLUSTER_SCOPED = {
    "Namespace",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "PriorityClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "Queue",
    "ResourceFlavor",
    "ClusterQueue",
    "Cohort",
    "WorkloadPriorityClass",
}


def test_namespaced_objects_live_in_namespace_tideflow() -> None:
    from tideflow.kube import KubeSettings

    namespace = KubeSettings().namespace
    assert named("Namespace", namespace)
    for obj in objects():
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], obj["metadata"]["name"]
        else:
            assert obj["metadata"].get("namespace") == namespace, obj["metadata"]["name"]


needs_schemas = pytest.mark.skipif(
    not SCHEMAS.is_dir(), reason=f"no CRD schemas at {SCHEMAS} (../shared/schemas)"
)


@needs_schemas
def test_volcano_and_kueue_objects_validate_against_their_crd_schemas() -> None:
    crds = [o for o in objects() if is_crd(o)]
    assert {o["kind"] for o in crds} >= {"Queue", "ResourceFlavor", "ClusterQueue", "LocalQueue"}
    for obj in crds:
        assert validate(obj, schema_for(obj)) == [], obj["metadata"]["name"]
    queue = copy.deepcopy(named("ClusterQueue", "vision"))
    queue["spec"]["cohort"] = "training"  # v1beta1's spelling: unknown in v1beta2
    assert validate(queue, schema_for(queue)) == [".spec.cohort: unknown field"]
    queue = copy.deepcopy(named("ClusterQueue", "vision"))
    queue["spec"]["queueingStrategy"] = "FIFO"
    assert validate(queue, schema_for(queue))


@needs_schemas
def test_volcano_team_queues_sit_under_the_queue_the_broker_moves() -> None:
    queues = by_kind("Queue")
    assert {q["metadata"]["name"] for q in queues} >= {"training"}
    children = [q for q in queues if q["spec"].get("parent") == "training"]
    assert children


# -- Kueue --------------------------------------------------------------------------------


def gang(team: str, device_class: str) -> Any:
    from tideflow.kube.volcano import GangShape

    return GangShape(
        name="g",
        labels={},
        command=["python", "-m", "train"],
        env={},
        workers=2,
        device_class=device_class,
        devices_per_worker=1,
        model=None,
        team=team,
        priority=0,
        max_restarts=1,
    )


def volcano_teams() -> set[str]:
    return {q["metadata"]["name"] for q in by_kind("Queue") if q["spec"].get("parent")}


def team_cluster_queues() -> list[dict[str, Any]]:
    local = {q["spec"]["clusterQueue"] for q in by_kind("LocalQueue")}
    return [q for q in by_kind("ClusterQueue") if q["metadata"]["name"] in local]


def test_kueue_has_one_local_queue_per_team_and_the_gang_names_it() -> None:
    from tideflow.kube import KubeSettings
    from tideflow.kube.jobset import QUEUE_LABEL, gang_jobset

    local = {q["metadata"]["name"]: q for q in by_kind("LocalQueue")}
    assert set(local) == volcano_teams() == {"vision", "nlp"}  # the same teams either way
    settings = KubeSettings(gang_scheduler="kueue")
    for team, queue in local.items():
        assert queue["metadata"]["namespace"] == settings.namespace
        assert named("ClusterQueue", queue["spec"]["clusterQueue"])
        labels = gang_jobset(gang(team, "gpu"), f"p/r/{team}", settings)["metadata"]["labels"]
        assert labels[QUEUE_LABEL] == team
    assert "training" not in {q["spec"]["clusterQueue"] for q in local.values()}


def test_kueue_queues_are_consistent() -> None:
    flavors = {f["metadata"]["name"] for f in by_kind("ResourceFlavor")}
    cluster_queues = by_kind("ClusterQueue")
    assert {q["spec"].get("cohortName") for q in cluster_queues} == {"training"}
    for queue in cluster_queues:
        seen: set[str] = set()
        for group in queue["spec"]["resourceGroups"]:
            covered = group["coveredResources"]
            assert not seen & set(covered), "a resource belongs to one group"
            seen |= set(covered)
            for flavor in group["flavors"]:
                assert flavor["name"] in flavors
                # Kueue wants each flavor's resources in the order of coveredResources.
                assert [r["name"] for r in flavor["resources"]] == covered
                for resource in flavor["resources"]:
                    if "lendingLimit" in resource:
                        assert quantity(resource["lendingLimit"]) <= quantity(
                            resource["nominalQuota"]
                        )
    h100 = named("ResourceFlavor", "h100")["spec"]
    assert h100["nodeLabels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    # The broker's pool label keeps training gangs off inference nodes, and its taint
    # is tolerated only through the flavor.
    from tideflow.broker.kubernetes import POOL_LABEL, TAINT_KEY

    assert h100["nodeLabels"][POOL_LABEL] == "training"
    assert {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in h100["tolerations"]


def quantity(value: Any) -> float:
    text = str(value)
    for suffix, factor in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def test_every_team_queue_covers_what_a_gang_pod_requests() -> None:
    from tideflow.kube import KubeSettings
    from tideflow.kube.torchrun import VOLCANO
    from tideflow.kube.volcano import gang_pod_spec

    for queue in team_cluster_queues():
        covered = {r for g in queue["spec"]["resourceGroups"] for r in g["coveredResources"]}
        for device_class in ("cpu", "gpu", "npu"):
            pod = gang_pod_spec(
                gang("vision", device_class),
                KubeSettings(),
                master_addr="m",
                index=VOLCANO,
                run_id="g",
            )
            requested = {r for c in pod["containers"] for r in c["resources"]["requests"]}
            assert requested <= covered, (queue["metadata"]["name"], device_class)


@pytest.mark.parametrize("flavor", ["h100", None])
def test_the_broker_moves_the_training_cluster_queues_h100_quota(
    kube: KubeFake, flavor: str | None
) -> None:
    from tideflow.broker.kubernetes import MERGE, ClusterTarget, KubernetesActuator

    target = ClusterTarget(queue_kind="kueue", kueue_flavor=flavor)
    KubernetesActuator(kube.client(BROKER), target)._set_training_quota(64)
    (patch,) = [r for r in kube.requests_by(BROKER) if r.verb == "patch"]
    # the patched queue was admitted: Kueue's CRD schema and its CEL rules
    assert (patch.name, patch.content_type, patch.code) == ("training", MERGE, 200)
    queue = kube.get("kueue.x-k8s.io/v1beta2", "ClusterQueue", ClusterTarget().training_queue)
    quotas = {
        (f["name"], r["name"]): r["nominalQuota"]
        for group in queue["spec"]["resourceGroups"]
        for f in group["flavors"]
        for r in f["resources"]
    }
    assert quotas == {("h100", "nvidia.com/gpu"): "64"}


def test_the_broker_finds_no_quota_in_a_team_queue_flavor_it_does_not_manage(
    kube: KubeFake,
) -> None:
    from tideflow.broker.kubernetes import ClusterTarget, KubernetesActuator

    target = ClusterTarget(queue_kind="kueue", kueue_flavor="a100")
    actuator = KubernetesActuator(kube.client(BROKER), target)
    with pytest.raises(ValueError, match=r"no nvidia\.com/gpu quota in flavor a100"):
        actuator._set_training_quota(64)


def test_gang_priority_classes_exist() -> None:
    from tideflow.kube import KubeSettings

    defined = {o["metadata"]["name"] for o in by_kind("PriorityClass")}
    assert {name for _, name in KubeSettings().priority_classes} <= defined


# -- No secrets in deploy/ ----------------------------------------------------------------

# Variables that hold a secret (not the name of a Secret, such as TIDEFLOW_K8S_STORE_SECRET).
SECRET_NAME = re.compile(
    r"(SECRET_ACCESS_KEY|SECRET_KEY$|PASSWORD|PASSWD|TOKEN|CREDENTIALS?$|PRIVATE_KEY|_KEY_ID$|_KEY$)",
    re.I,
)
SECRET_KEYS = {
    "password",
    "pass",
    "fernetKey",
    "jwtSecret",
    "apiSecretKey",
    "webserverSecretKey",
    "sshKey",
    "keytabBase64Content",
    "token",
}
INLINE = [
    re.compile(r"\w+://[^/\s:@]+:[^/\s@]+@"),  # user:password@ in a URI
    re.compile(r"AKIA[0-9A-Z]{16}"),  # an AWS access key id
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
]


def inline_secrets(node: Any, path: str = "") -> list[str]:
    """Places in a parsed YAML document where a secret value is written out."""
    found = []
    if isinstance(node, dict):
        if node.get("kind") == "Secret" and (node.get("data") or node.get("stringData")):
            found.append(f"{path}: a Secret with its data")
        name = node.get("name")
        if isinstance(name, str) and SECRET_NAME.search(name) and node.get("value"):
            found.append(f"{path}.{name}: a value instead of valueFrom")
        for key, item in node.items():
            if key in SECRET_KEYS and item not in (None, "", {}):
                found.append(f"{path}.{key}")
            found += inline_secrets(item, f"{path}.{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found += inline_secrets(item, f"{path}[{index}]")
    elif isinstance(node, str):
        found += [f"{path}: {p.pattern}" for p in INLINE if p.search(node)]
        if "\n" in node or node.lstrip().startswith("- "):  # a templated YAML string
            with contextlib.suppress(yaml.YAMLError):
                found += inline_secrets(yaml.safe_load(node), path)
    return found


def test_nothing_secret_is_written_in_deploy() -> None:
    files = sorted((REPO / "deploy").rglob("*.yaml"))
    assert VALUES in files and DEPLOY / "mlflow.yaml" in files
    for path in files:
        for document in yaml.safe_load_all(path.read_text()):
            assert inline_secrets(document) == [], path.name
        text = path.read_text()
        assert not any(p.search(text) for p in INLINE), path.name  # comments included


def test_the_secret_scan_can_fail() -> None:
    planted = [
        {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "abc"}]},
        {"kind": "Secret", "stringData": {"uri": "x"}},
        {"args": ["--backend-store-uri=postgresql://mlflow:hunter2@db:5432/mlflow"]},
        {"webserver": {"defaultUser": {"password": "admin"}}},
        {"extraEnv": "- name: GIT_TOKEN\n  value: abc\n"},
    ]
    for document in planted:
        assert inline_secrets(document), document
    references = {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {}}}]}
    assert inline_secrets(references) == []


# -- Helm values for the Airflow chart ---------------------------------------------------

# Keys of the official chart's values.yaml (apache/airflow chart/, 1.18 and 1.19) that
# these values use, checked against the chart's values.yaml and values.schema.json.
CHART_KEYS = {
    "airflowVersion",
    "labels",
    "securityContexts",
    "statsd",
    "statsd.securityContexts",
    "defaultAirflowRepository",
    "defaultAirflowTag",
    "images",
    "images.airflow",
    "images.airflow.repository",
    "images.airflow.tag",
    "images.airflow.pullPolicy",
    "executor",
    "postgresql",
    "postgresql.enabled",
    "data",
    "data.metadataSecretName",
    "fernetKeySecretName",
    "apiSecretKeySecretName",
    "jwtSecretName",
    "createUserJob",
    "createUserJob.enabled",
    "dags",
    "dags.gitSync",
    *(
        f"dags.gitSync.{key}"
        for key in (
            "enabled",
            "repo",
            "branch",
            "ref",
            "rev",
            "subPath",
            "depth",
            "period",
            "credentialsSecret",
            "securityContexts",
        )
    ),
    "env",
    "extraEnvFrom",
    "workers",
    "workers.serviceAccount",
    "workers.serviceAccount.create",
    "workers.serviceAccount.name",
    "workers.securityContexts",
    "workers.resources",
    "scheduler",
    "scheduler.securityContexts",
    "dagProcessor",
    "dagProcessor.securityContexts",
    "dagProcessor.resources",
    "triggerer",
    "triggerer.serviceAccount",
    "triggerer.serviceAccount.create",
    "triggerer.serviceAccount.name",
    "triggerer.securityContexts",
    "apiServer",
    "apiServer.securityContexts",
    "config",
}
# Free-form below these keys: Kubernetes objects or Airflow's own configuration.
FREE_FORM = {
    "config",
    "labels",
    "securityContexts.pod",
    "securityContexts.containers",
    "statsd.securityContexts.pod",
    "statsd.securityContexts.container",
    "workers.resources",
    "dagProcessor.resources",
    "workers.serviceAccount.annotations",
    *(
        f"{component}.securityContexts.{level}"
        for component in ("workers", "scheduler", "dagProcessor", "triggerer", "apiServer")
        for level in ("pod", "container")
    ),
    "dags.gitSync.securityContexts.container",
}


def value_keys(node: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, item in node.items():
        path = f"{prefix}{key}"
        if path in FREE_FORM:
            continue
        keys.append(path)
        if isinstance(item, dict):
            keys += value_keys(item, f"{path}.")
    return keys


def test_helm_values_use_only_keys_the_chart_has() -> None:
    unknown = [k for k in value_keys(values()) if k not in CHART_KEYS]
    assert unknown == []
    misspelled = {**values(), "executer": "KubernetesExecutor"}
    assert [k for k in value_keys(misspelled) if k not in CHART_KEYS] == ["executer"]


def chart_env() -> dict[str, str]:
    return {e["name"]: e["value"] for e in values()["env"]}


def test_helm_values_run_tideflow_on_the_kubernetes_executor() -> None:
    chart = values()
    assert chart["executor"] == "KubernetesExecutor"
    assert chart["airflowVersion"].startswith("3.3.")
    assert chart["postgresql"]["enabled"] is False  # a managed database
    # A custom image with tideflow, for every container and task pod.
    image = chart["images"]["airflow"]
    assert image["repository"] != "apache/airflow" and image["tag"]
    assert (chart["defaultAirflowRepository"], chart["defaultAirflowTag"]) == (
        image["repository"],
        image["tag"],
    )


def test_helm_values_sync_dags_from_git_with_a_credentials_secret() -> None:
    sync = values()["dags"]["gitSync"]
    assert sync["enabled"] is True
    assert sync["repo"].startswith(("https://", "ssh://", "git@"))
    assert sync["branch"] and sync["ref"] and sync["subPath"] == "dags"
    assert sync["credentialsSecret"]
    assert "sshKey" not in sync and "password" not in str(sync).lower()
    # The pipelines sit beside the DAG files in the synced checkout.
    env = chart_env()
    checkout = "/opt/airflow/dags/repo"
    assert env["TIDEFLOW_PIPELINES_DIR"] == f"{checkout}/pipelines"
    assert (REPO / "pipelines").is_dir() and (REPO / sync["subPath"]).is_dir()


def test_helm_values_configure_tideflow_for_the_cluster() -> None:
    from tideflow.kube.settings import SCHEDULERS, kube_settings_from_env

    env = chart_env()
    assert {
        "TIDEFLOW_PIPELINES_DIR",
        "MLFLOW_TRACKING_URI",
        "TIDEFLOW_BACKEND",
        "TIDEFLOW_K8S_NAMESPACE",
        "TIDEFLOW_K8S_IMAGE",
        "TIDEFLOW_K8S_GANG_SCHEDULER",
    } <= set(env)
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow.tideflow:5000"
    assert env["TIDEFLOW_BACKEND"] == "kubernetes"
    assert env["TIDEFLOW_ARTIFACT_ROOT"].startswith("s3://")  # gang pods must reach it
    settings = kube_settings_from_env(env)  # refuses a bad value by its variable's name
    assert settings.namespace == "tideflow" and settings.gang_scheduler in SCHEDULERS
    assert settings.image == env["TIDEFLOW_K8S_IMAGE"]
    # S3 credentials from the same Secret the gang pods read, by reference.
    (source,) = yaml.safe_load(values()["extraEnvFrom"])
    assert source == {"secretRef": {"name": settings.store_secret}}


def values_pod() -> dict[str, Any]:
    """The Kubernetes fragments of the values, put where the chart puts them in a task pod."""
    chart = values()
    workers = chart["workers"]
    sync = chart["dags"]["gitSync"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "task", "namespace": "tideflow"},
        "spec": {
            "serviceAccountName": workers["serviceAccount"]["name"],
            "securityContext": workers["securityContexts"]["pod"],
            "initContainers": [
                {
                    "name": "git-sync-init",
                    "image": "registry.k8s.io/git-sync/git-sync:v4.4.2",
                    "securityContext": sync["securityContexts"]["container"],
                    "env": [
                        {
                            "name": key,
                            "valueFrom": {
                                "secretKeyRef": {"name": sync["credentialsSecret"], "key": key}
                            },
                        }
                        for key in ("GITSYNC_USERNAME", "GITSYNC_PASSWORD")
                    ],
                }
            ],
            "containers": [
                {
                    "name": "base",
                    "image": f"{chart['images']['airflow']['repository']}:"
                    f"{chart['images']['airflow']['tag']}",
                    "env": chart["env"],
                    "envFrom": yaml.safe_load(chart["extraEnvFrom"]),
                    "securityContext": workers["securityContexts"]["container"],
                    "resources": workers["resources"],
                }
            ],
        },
    }


def test_helm_values_fragments_validate_inside_a_pod() -> None:
    import kubernetes_validate

    chart = values()
    pod = values_pod()
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert restricted_problems(pod["spec"]) == []
    for component in ("scheduler", "dagProcessor", "triggerer", "apiServer"):
        contexts = chart[component]["securityContexts"]
        one = copy.deepcopy(pod)
        one["spec"]["securityContext"] = contexts["pod"]
        one["spec"]["containers"][0]["securityContext"] = contexts["container"]
        kubernetes_validate.validate(one, K8S_VERSION, strict=True)
        assert restricted_problems(one["spec"]) == [], component
    broken = copy.deepcopy(pod)
    broken["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalaton"] = False
    with pytest.raises(kubernetes_validate.ValidationError, match="allowPrivilegeEscalaton"):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


# -- The guide ----------------------------------------------------------------------------


def test_the_guide_builds_the_image_the_values_name_and_applies_every_manifest() -> None:
    guide = GUIDE.read_text()
    chart = values()
    blocks = re.findall(r"```dockerfile\n(.*?)```", guide, flags=re.S)
    airflow = [b for b in blocks if b.startswith("FROM apache/airflow:")]
    assert airflow, "the guide shows the Airflow image's Dockerfile"
    assert airflow[0].startswith(f"FROM apache/airflow:{chart['airflowVersion']}")
    assert "pip install" in airflow[0] and "tideflow" in airflow[0]
    assert f"{chart['images']['airflow']['repository']}:{chart['images']['airflow']['tag']}" in (
        guide
    )
    for path in sorted(DEPLOY.glob("*.yaml")):
        assert f"deploy/kubernetes/{path.name}" in guide, path.name
    assert "deploy/helm/airflow-values.yaml" in guide


def test_the_demo_lab_is_a_valid_cluster_file_whose_broker_is_a_tenant() -> None:
    """The demo's lab (``make demo``): it loads through the cluster file's validation,
    declares the broker's team ``inference`` with a GPU quota vision may borrow, and is
    the file the demo's broker settings point to."""
    from tideflow.broker.local import INFERENCE_TEAM
    from tideflow.inventory import load_cluster
    from tideflow.scheduling.quota import Teams
    from tideflow.stack.team_story import BROKER_ENV
    from tideflow.stack.team_story import LAB_CLUSTER as STORY_LAB

    assert STORY_LAB == LAB_CLUSTER
    assert BROKER_ENV["TIDEFLOW_CLUSTER_FILE"] == str(LAB_CLUSTER)
    inventory = load_cluster(LAB_CLUSTER)
    teams = Teams.of(inventory)
    assert teams is not None and teams.governs(INFERENCE_TEAM) and teams.governs("vision")
    inference = teams.nominal(INFERENCE_TEAM, ("gpu", None))
    vision = teams.nominal("vision", ("gpu", None))
    gpus = sum(n.devices for n in inventory.nodes if n.device_class == "gpu")
    assert inference > 0 and vision > 0 and inference + vision <= gpus
    assert (INFERENCE_TEAM, "vision") in teams.rules
