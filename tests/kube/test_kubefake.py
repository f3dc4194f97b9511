"""The Kubernetes fake (tests/kubefake) against the upstream rules it claims to reproduce.

Each rule is shown to accept a valid example and refuse an invalid one, with the
message upstream gives, on objects written here (not tideflow's), through the
real ``kubernetes`` / ``kubernetes_asyncio`` clients where the rule is the API's.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubefake import ADMIN, DEPLOY, ApiError, KubeFake, service_account
from tests.kubefake.kueue import NotAdmittedError
from tests.kubefake.volcano import Volcano

NS = "tideflow"
BROKER = service_account(NS, "tideflow-broker")
WORKER = service_account(NS, "tideflow-airflow-worker")
TRIGGERER = service_account(NS, "tideflow-airflow-triggerer")


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    with KubeFake() as started:
        yield started


def configmap(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"a": "1"}}


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
    }


def refused(fake: KubeFake, obj: dict[str, Any], user: str = ADMIN) -> ApiError:
    with pytest.raises(ApiError) as info:
        fake.create(obj, user)
    return info.value


# -- the store and the API ----------------------------------------------------------------


def test_create_get_list_conflict_and_not_found_through_the_real_client(fake: KubeFake) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(fake.client())
    first = core.create_namespaced_config_map(NS, configmap("a", {"team": "x"}))
    second = core.create_namespaced_config_map(NS, configmap("b", {"team": "y"}))
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    with pytest.raises(ApiException) as info:
        core.create_namespaced_config_map(NS, configmap("a"))
    assert info.value.status == 409 and '"AlreadyExists"' in info.value.body
    with pytest.raises(ApiException) as info:
        core.read_namespaced_config_map("missing", NS)
    assert info.value.status == 404 and 'configmaps \\"missing\\" not found' in info.value.body
    assert [m.metadata.name for m in core.list_namespaced_config_map(NS).items] == ["a", "b"]
    selected = core.list_namespaced_config_map(NS, label_selector="team in (y,z)").items
    assert [m.metadata.name for m in selected] == ["b"]
    by_name = core.list_namespaced_config_map(NS, field_selector="metadata.name=a").items
    assert [m.metadata.name for m in by_name] == ["a"]
    absent = core.list_namespaced_config_map(NS, label_selector="!team").items
    assert absent == []


def test_a_namespaced_object_needs_its_namespace(fake: KubeFake) -> None:
    obj = configmap("a")
    obj["metadata"]["namespace"] = "elsewhere"
    error = refused(fake, obj)
    assert error.code == 404 and error.message == 'namespaces "elsewhere" not found'


def test_a_stale_resource_version_is_a_conflict(fake: KubeFake) -> None:
    created = fake.create(configmap("a"))
    updated = copy.deepcopy(created)
    updated["data"] = {"a": "2"}
    code, _ = fake.request("PUT", f"/api/v1/namespaces/{NS}/configmaps/a", body=updated)
    assert code == 200
    code, answer = fake.request("PUT", f"/api/v1/namespaces/{NS}/configmaps/a", body=updated)
    assert code == 409 and "the object has been modified" in answer["message"]


def test_patches_merge_json_and_strategic_as_the_api_server_applies_them(
    fake: KubeFake,
) -> None:
    fake.create(pod("p", {"a": "1"}, tolerations=[{"key": "k", "operator": "Exists"}]))
    path = f"/api/v1/namespaces/{NS}/pods/p"
    merge = {"metadata": {"labels": {"a": None, "b": "2"}}, "spec": {"tolerations": []}}
    code, patched = fake.request(
        "PATCH", path, body=merge, content_type="application/merge-patch+json"
    )
    assert code == 200 and patched["metadata"]["labels"] == {"b": "2"}
    assert patched["spec"]["tolerations"] == []  # a merge patch replaces lists whole
    strategic = {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}
    code, patched = fake.request(
        "PATCH", path, body=strategic, content_type="application/strategic-merge-patch+json"
    )
    assert code == 200 and patched["spec"]["containers"][0]["image"] == "busybox:2"
    ops = [{"op": "replace", "path": "/metadata/labels/b", "value": "3"}]
    code, patched = fake.request(
        "PATCH", path, body=ops, content_type="application/json-patch+json"
    )
    assert code == 200 and patched["metadata"]["labels"] == {"b": "3"}
    # the kubernetes client's default patch type is a JSON patch: a dict is refused
    code, answer = fake.request(
        "PATCH", path, body=merge, content_type="application/json-patch+json"
    )
    assert code == 400 and "jsonPatchOp" in answer["message"]
    fake.apply(DEPLOY / "kueue-queues.yaml")
    code, answer = fake.request(
        "PATCH",
        "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/training",
        body={"spec": {}},
        content_type="application/strategic-merge-patch+json",
    )
    assert code == 415  # no strategic merge patch for custom resources


def test_the_main_resource_never_writes_status(fake: KubeFake) -> None:
    created = fake.create({**pod("p"), "status": {"phase": "Running"}})
    assert "status" not in created


def test_delete_cascades_to_dependents_unless_orphaned(fake: KubeFake) -> None:
    owner = fake.create(configmap("owner"))
    for name in ("dep-1", "dep-2"):
        obj = configmap(name)
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": "owner",
                "uid": owner["metadata"]["uid"],
            }
        ]
        fake.create(obj)
    code, _ = fake.request(
        "DELETE", f"/api/v1/namespaces/{NS}/configmaps/owner?propagationPolicy=Orphan"
    )
    assert code == 200 and fake.get("v1", "ConfigMap", "dep-1")["metadata"]["ownerReferences"] == []
    owner = fake.create(configmap("owner"))
    obj = fake.get("v1", "ConfigMap", "dep-2")
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    ]
    fake.request("PUT", f"/api/v1/namespaces/{NS}/configmaps/dep-2", body=obj)
    fake.request("DELETE", f"/api/v1/namespaces/{NS}/configmaps/owner?propagationPolicy=Foreground")
    assert fake.get("v1", "ConfigMap", "dep-2") is None
    assert fake.get("v1", "ConfigMap", "dep-1") is not None


def test_a_watch_streams_changes_and_answers_410_for_a_compacted_version(fake: KubeFake) -> None:
    from kubernetes_asyncio import client, watch
    from kubernetes_asyncio.client.exceptions import ApiException

    fake.create(configmap("a"))
    _, listing = fake.request("GET", f"/api/v1/namespaces/{NS}/configmaps")
    version = listing["metadata"]["resourceVersion"]

    async def changes(since: str) -> list[tuple[str, str]]:
        seen = []
        async with client.ApiClient(fake.async_configuration()) as api:
            core = client.CoreV1Api(api)
            stream = watch.Watch().stream(
                core.list_namespaced_config_map, NS, resource_version=since, timeout_seconds=1
            )
            async with stream as events:
                async for event in events:
                    seen.append((event["type"], event["raw_object"]["metadata"]["name"]))
        return seen

    fake.create(configmap("b"))
    fake.request("DELETE", f"/api/v1/namespaces/{NS}/configmaps/a")
    assert asyncio.run(changes(version)) == [("ADDED", "b"), ("DELETED", "a")]
    fake.store.compact()
    with pytest.raises(ApiException) as info:
        asyncio.run(changes(version))
    assert info.value.status == 410 and "too old resource version" in str(info.value.reason)
    fake.store.window = 1  # keep one change only
    _, listing = fake.request("GET", f"/api/v1/namespaces/{NS}/configmaps")
    fake.create(configmap("c"))
    fake.create(configmap("d"))
    with pytest.raises(ApiException):
        asyncio.run(changes(listing["metadata"]["resourceVersion"]))


def test_the_request_log_records_who_asked_what_and_the_answer(fake: KubeFake) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException):
        client.CoreV1Api(fake.client(WORKER)).list_namespaced_pod(NS)
    (logged,) = fake.requests_by(WORKER)
    assert (logged.method, logged.verb, logged.resource, logged.namespace, logged.code) == (
        "GET",
        "list",
        "pods",
        NS,
        403,
    )


# -- eviction and PodDisruptionBudgets ----------------------------------------------------


def test_eviction_honours_the_disruption_budget(fake: KubeFake) -> None:
    for name in ("p-0", "p-1", "p-2"):
        fake.create(pod(name, {"app": "x"}))
        fake.pods.run(NS, name)
    budget = fake.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "x", "namespace": NS},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "x"}}},
        }
    )
    fake.set_status(
        budget,
        {"disruptionsAllowed": 0, "desiredHealthy": 2, "currentHealthy": 2, "expectedPods": 3},
    )
    evict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p-0"}}
    code, answer = fake.request("POST", f"/api/v1/namespaces/{NS}/pods/p-0/eviction", body=evict)
    assert code == 429 and answer["reason"] == "TooManyRequests"
    assert answer["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    (cause,) = answer["details"]["causes"]
    assert cause == {
        "reason": "DisruptionBudget",
        "message": "The disruption budget x needs 2 healthy pods and has 2 currently",
    }
    budget = fake.get("policy/v1", "PodDisruptionBudget", "x")
    fake.set_status(budget, {**budget["status"], "disruptionsAllowed": 1})
    code, answer = fake.request("POST", f"/api/v1/namespaces/{NS}/pods/p-0/eviction", body=evict)
    assert code == 201 and answer["status"] == "Success"
    evicted = fake.get("v1", "Pod", "p-0")  # deleted gracefully: terminating, then gone
    assert evicted["metadata"]["deletionTimestamp"] and evicted["status"]["phase"] == "Failed"
    assert {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"} in (
        evicted["status"]["conditions"]
    )
    assert fake.pods.finish_terminating(NS) == 1 and fake.get("v1", "Pod", "p-0") is None
    assert fake.get("policy/v1", "PodDisruptionBudget", "x")["status"]["disruptionsAllowed"] == 0
    # a pod not yet running is evicted without consulting the budget
    fake.create(pod("pending", {"app": "x"}))
    evict["metadata"]["name"] = "pending"
    code, _ = fake.request("POST", f"/api/v1/namespaces/{NS}/pods/pending/eviction", body=evict)
    assert code == 201
    code, _ = fake.request("POST", f"/api/v1/namespaces/{NS}/pods/pending/eviction", body=evict)
    assert code == 404


def test_a_pod_under_two_budgets_cannot_be_evicted(fake: KubeFake) -> None:
    fake.create(pod("p", {"app": "x"}))
    fake.pods.run(NS, "p")
    for name in ("one", "two"):
        fake.create(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "x"}}},
            }
        )
    code, answer = fake.request(
        "POST", f"/api/v1/namespaces/{NS}/pods/p/eviction", body={"metadata": {"name": "p"}}
    )
    assert code == 500 and "more than one PodDisruptionBudget" in answer["message"]


# -- schemas: strict fields, CRD defaults, CEL rules ----------------------------------------


def test_unknown_fields_are_refused_and_schema_errors_are_invalid(fake: KubeFake) -> None:
    misspelled = pod("p")
    misspelled["spec"]["containers"][0]["imagex"] = "busybox"
    error = refused(fake, misspelled)
    assert error.code == 400 and 'unknown field "spec.containers.0.imagex"' in error.message
    wrong_type = pod("p")
    wrong_type["spec"]["containers"][0]["image"] = 7
    error = refused(fake, wrong_type)
    assert error.code == 422 and error.message.startswith('Pod "p" is invalid: ')
    queue = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "q"},
        "spec": {"weight": 1, "capabilty": {"cpu": "1"}},
    }
    error = refused(fake, queue)
    assert error.code == 400 and 'unknown field "spec.capabilty"' in error.message


@pytest.mark.parametrize("kind", ["Pod", "Queue"])
def test_every_objects_name_and_labels_follow_the_api_servers_metadata_rules(
    fake: KubeFake, kind: str
) -> None:
    """apimachinery ValidateObjectMeta / ValidateLabels run for built-in and custom
    resources alike: a label value is at most 63 characters, a key a qualified name."""

    def obj(name: str, labels: dict[str, str]) -> dict[str, Any]:
        if kind == "Pod":
            made = pod(name)
        else:
            made = {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": {"weight": 1},
            }
        made["metadata"]["labels"] = labels
        return made

    fake.create(obj("ok", {"tideflow.io/gang": "g" * 63, "a_b.c": ""}))
    error = refused(fake, obj("long", {"tideflow.io/gang": "g" * 64}))
    assert error.code == 422 and "must be no more than 63 characters" in error.message
    error = refused(fake, obj("bad-key", {"tideflow.io/": "x"}))
    assert "name part must be non-empty" in error.message
    error = refused(fake, obj("bad-value", {"k": "-starts-with-a-dash"}))
    assert "a valid label must be an empty string" in error.message
    error = refused(fake, obj("Upper", {}))
    assert "a lowercase RFC 1123 subdomain" in error.message


def cluster_queue(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "cq"},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": 4}]}],
                }
            ],
            **spec,
        },
    }


def test_crd_defaults_are_applied_as_the_api_server_does(fake: KubeFake) -> None:
    created = fake.create(cluster_queue())
    assert created["spec"]["queueingStrategy"] == "BestEffortFIFO"  # the schema's default


def test_crd_cel_rules_are_enforced(fake: KubeFake) -> None:
    """kueue ClusterQueue: 'borrowingLimit must be nil when cohort is empty'; ResourceFlavor:
    taint effects; JobSet: immutable fields on update (transition rules)."""
    borrowing = cluster_queue()
    borrowing["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"] = 1
    error = refused(fake, borrowing)
    assert error.code == 422 and "borrowingLimit must be nil when cohort is empty" in error.message
    borrowing["spec"]["cohortName"] = "c"
    fake.create(borrowing)
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "f"},
        "spec": {"nodeTaints": [{"key": "k", "value": "v", "effect": "Sometimes"}]},
    }
    error = refused(fake, flavor)
    assert error.code == 422
    flavor["spec"]["nodeTaints"][0]["effect"] = "NoSchedule"
    fake.create(flavor)


# -- built-in admission: Priority, ValidatingAdmissionPolicy --------------------------------


def test_pod_priority_comes_from_its_priority_class(fake: KubeFake) -> None:
    fake.apply(DEPLOY / "priority-classes.yaml")
    created = fake.create(pod("p", priorityClassName="tideflow-training"))
    assert created["spec"]["priority"] == 1000
    error = refused(fake, pod("q", priorityClassName="gold"))
    assert error.code == 403
    assert error.message == 'pods "q" is forbidden: no PriorityClass with name gold was found'
    error = refused(fake, pod("r", priorityClassName="tideflow-training", priority=5))
    assert error.code == 403 and "must not be provided in pod spec" in error.message


def node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def test_the_brokers_node_patches_pass_the_admission_policy_from_deploy(fake: KubeFake) -> None:
    fake.apply(DEPLOY / "broker-rbac.yaml")
    fake.create(node("gpu-1", {"nvidia.com/gpu.present": "true", "tideflow.io/pool": "training"}))
    move = {
        "metadata": {"labels": {"tideflow.io/pool": "inference"}},
        "spec": {
            "taints": [{"key": "tideflow.io/pool", "value": "inference", "effect": "NoSchedule"}]
        },
    }
    path = "/api/v1/nodes/gpu-1"
    merge = "application/merge-patch+json"
    code, _ = fake.request("PATCH", path, user=BROKER, body=move, content_type=merge)
    assert code == 200
    relabel = {"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}}
    code, answer = fake.request("PATCH", path, user=BROKER, body=relabel, content_type=merge)
    assert code == 422 and answer["message"] == (
        "ValidatingAdmissionPolicy 'tideflow-broker-nodes' with binding 'tideflow-broker-nodes' "
        "denied request: the broker may change no label of a node but tideflow.io/pool"
    )
    code, _ = fake.request("PATCH", path, user=ADMIN, body=relabel, content_type=merge)
    assert code == 200  # the policy binds the broker's identity only


# -- RBAC from deploy/ ----------------------------------------------------------------------


def test_rbac_from_deploy_allows_what_it_grants_and_refuses_the_rest(fake: KubeFake) -> None:
    fake.apply(DEPLOY / "kueue-queues.yaml")
    fake.create(node("gpu-1", {}))
    cq = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues"
    assert fake.request("GET", f"{cq}/training", user=BROKER)[0] == 200
    code, answer = fake.request("GET", f"{cq}/vision", user=BROKER)
    assert code == 403 and answer["message"] == (
        'clusterqueues.kueue.x-k8s.io "vision" is forbidden: User '
        '"system:serviceaccount:tideflow:tideflow-broker" cannot get resource "clusterqueues" '
        'in API group "kueue.x-k8s.io" at the cluster scope'
    )
    assert fake.request("GET", cq, user=BROKER)[0] == 403  # get is granted, list is not
    assert fake.request("GET", "/api/v1/nodes", user=BROKER)[0] == 200
    assert fake.request("GET", f"/api/v1/namespaces/{NS}/pods", user=BROKER)[0] == 200
    # the worker's Role is in namespace tideflow only, and grants jobs, not pods
    jobs = "/apis/batch.volcano.sh/v1alpha1/namespaces/{}/jobs/x"
    assert fake.request("GET", jobs.format(NS), user=WORKER)[0] == 404
    assert fake.request("GET", jobs.format("default"), user=WORKER)[0] == 403
    assert fake.request("GET", f"/api/v1/namespaces/{NS}/pods", user=WORKER)[0] == 403
    # subresources are their own resource: pods/eviction is not pods
    code, answer = fake.request(
        "POST", f"/api/v1/namespaces/{NS}/pods/p/eviction", user=TRIGGERER, body={}
    )
    assert code == 403 and 'cannot create resource "pods/eviction"' in answer["message"]
    code, _ = fake.request("GET", "/api/v1/nodes", user="system:anonymous")
    assert code == 403
    unused = {(g.resource, g.verb, g.name) for g in fake.rbac.unused(BROKER, NS)}
    assert ("clusterqueues", "get", "training") not in unused
    assert ("clusterqueues", "patch", "training") in unused
    assert ("pods/eviction", "create", "") in unused


def test_resource_names_limit_a_list_to_the_name_its_field_selector_gives() -> None:
    from tests.kubefake.rbac import Authorizer
    from tests.kubefake.resources import parse

    role = {
        "kind": "Role",
        "metadata": {"name": "r", "namespace": NS},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "verbs": ["list"],
                "resourceNames": ["a"],
            }
        ],
    }
    binding = {
        "kind": "RoleBinding",
        "metadata": {"name": "r", "namespace": NS},
        "roleRef": {"kind": "Role", "name": "r"},
        "subjects": [{"kind": "ServiceAccount", "name": "x", "namespace": NS}],
    }
    rbac = Authorizer([role, binding])
    user = service_account(NS, "x")
    path = f"/api/v1/namespaces/{NS}/configmaps"
    assert rbac.allowed(user, parse("GET", f"{path}?fieldSelector=metadata.name%3Da"))
    assert not rbac.allowed(user, parse("GET", f"{path}?fieldSelector=metadata.name%3Db"))
    assert not rbac.allowed(user, parse("GET", path))
    assert not rbac.allowed(
        service_account(NS, "y"), parse("GET", f"{path}?fieldSelector=metadata.name%3Da")
    )


def test_an_unknown_token_is_unauthorized(fake: KubeFake) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = fake.client(BROKER)
    api.configuration.api_key = {"authorization": "not-a-token"}
    with pytest.raises(ApiException) as info:
        client.CoreV1Api(api).list_node()
    assert info.value.status == 401


# -- Volcano: webhooks ----------------------------------------------------------------------


def queue(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"weight": 1, **spec},
    }


def vcjob(
    name: str = "j",
    *,
    replicas: int = 2,
    policies: list[dict[str, Any]] | None = None,
    task_policies: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    task: dict[str, Any] = {
        "name": "worker",
        "replicas": replicas,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox"}],
            }
        },
    }
    if task_policies is not None:
        task["policies"] = task_policies
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "queue": "team",
            "tasks": [task],
            "plugins": {"svc": [], "env": []},
            **({"policies": policies} if policies is not None else {}),
            **spec,
        },
    }


@pytest.fixture
def volcano(fake: KubeFake) -> KubeFake:
    fake.create(queue("team"))
    return fake


def test_volcano_mutating_webhook_fills_in_its_defaults(volcano: KubeFake) -> None:
    """mutate_job.go: maxRetry 0 -> 3, minAvailable from the tasks, task minAvailable and
    maxRetry, the scheduler name; an empty queue becomes "default"."""
    created = volcano.create(vcjob(maxRetry=0))
    spec = created["spec"]
    assert spec["maxRetry"] == 3 and spec["minAvailable"] == 2
    assert spec["schedulerName"] == "volcano"
    assert spec["tasks"][0]["minAvailable"] == 2 and spec["tasks"][0]["maxRetry"] == 3
    assert volcano.create(vcjob("k", maxRetry=2))["spec"]["maxRetry"] == 2
    error = refused(volcano, vcjob("l", queue=""))
    assert "unable to find job queue" in error.message and '"default" not found' in error.message


POLICY_CASES = {
    "event and exit code together": (
        [{"event": "PodFailed", "exitCode": 3, "action": "RestartJob"}],
        "must not specify event and exitCode simultaneously",
    ),
    "neither event nor exit code": (
        [{"action": "RestartJob"}],
        "either event and exitCode should be specified",
    ),
    "exit code 0": ([{"exitCode": 0, "action": "RestartJob"}], "0 is not a valid error code"),
    "an exit code twice": (
        [{"exitCode": 3, "action": "RestartJob"}, {"exitCode": 3, "action": "AbortJob"}],
        "duplicate exitCode 3",
    ),
    "an event twice": (
        [
            {"event": "PodFailed", "action": "RestartJob"},
            {"event": "PodFailed", "action": "AbortJob"},
        ],
        "duplicate event PodFailed  across different policy",
    ),
    "an internal event": (
        [{"event": "OutOfSync", "action": "RestartJob"}],
        'spec.policies: Invalid value: "OutOfSync": invalid policy event',
    ),
    "an internal action": (
        [{"event": "PodFailed", "action": "SyncJob"}],
        'spec.policies: Invalid value: "SyncJob": invalid policy action',
    ),
    "any event beside others": (
        [{"event": "*", "action": "RestartJob"}, {"event": "PodFailed", "action": "AbortJob"}],
        "if there's * here, no other policy should be here",
    ),
}


@pytest.mark.parametrize("case", sorted(POLICY_CASES))
def test_volcano_refuses_invalid_policies(volcano: KubeFake, case: str) -> None:
    """validate/util.go validatePolicies, at job level and at task level."""
    policies, message = POLICY_CASES[case]
    error = refused(volcano, vcjob(policies=policies))
    assert error.code == 400 and error.reason == ""
    assert error.message.startswith(
        'admission webhook "validatejob.volcano.sh" denied the request:'
    )
    assert message in error.message and "valid events are" in error.message
    task_level = message.replace("spec.policies", "spec.tasks.policies")
    assert task_level in refused(volcano, vcjob("t", task_policies=policies)).message


def test_volcano_accepts_valid_policies(volcano: KubeFake) -> None:
    policies = [
        {"exitCode": 76, "action": "TerminateJob"},
        {"events": ["PodEvicted", "PodFailed"], "action": "RestartJob"},
        {"event": "TaskCompleted", "action": "CompleteJob"},
    ]
    assert volcano.create(vcjob(policies=policies))["spec"]["policies"] == policies


def test_volcano_job_shape_rules(volcano: KubeFake) -> None:
    """admit_job.go validateJobCreate: minAvailable within the replicas, pod and job names,
    known plugins, an existing open leaf queue."""
    error = refused(volcano, vcjob(minAvailable=3))
    assert "job 'minAvailable' should not be greater than total replicas in tasks" in error.message
    long_name = "j" * 55
    error = refused(volcano, vcjob(long_name))
    assert f"create pod with name {long_name}-worker-0 validate failed" in error.message
    assert "name part must be no more than 63 characters" in error.message
    volcano.create(vcjob("j" * 54))  # <job>-worker-0 is 63 characters
    error = refused(volcano, vcjob(plugins={"magic": []}))
    assert "unable to find job plugin: magic" in error.message
    volcano.create(queue("parent"))
    volcano.create(queue("child", parent="parent"))
    error = refused(volcano, vcjob(queue="parent"))
    assert "can only submit job to leaf queue, queue `parent` has 1 child queues" in error.message
    closed = volcano.get("scheduling.volcano.sh/v1beta1", "Queue", "child")
    volcano.set_status(closed, {"state": "Closed"})
    error = refused(volcano, vcjob(queue="child"))
    assert "can only submit job to queue with state `Open`, queue `child` status is `Closed`" in (
        error.message
    )


def test_volcano_queue_hierarchy_rules(fake: KubeFake) -> None:
    """validate_queue.go: deserved within capability; the children's deserved within the
    parent's (validateSiblingsSum; a parent without deserved has none to share); a child's
    capability within its ancestor's; the parent's capability at least its children's."""
    error = refused(fake, queue("q", deserved={"cpu": "4"}, capability={"cpu": "2"}))
    assert error.message.endswith(
        'requestBody.spec.deserved.cpu: Invalid value: "4": deserved[cpu]=4 must be <= '
        "capability[cpu]=2"
    )
    fake.create(queue("parent", capability={"nvidia.com/gpu": "16"}))
    error = refused(fake, queue("child", parent="parent", deserved={"nvidia.com/gpu": "8"}))
    assert error.code == 400 and error.message == (
        'admission webhook "validatequeue.volcano.sh" denied the request: parent queue parent '
        "validation failed: sum of children's deserved (cpu 0.00, memory 0.00, nvidia.com/gpu "
        "8000.00) exceeds parent's deserved limit (cpu 0.00, memory 0.00)"
    )
    fake.create(
        queue("shared", deserved={"nvidia.com/gpu": "16"}, capability={"nvidia.com/gpu": "16"})
    )
    fake.create(queue("a", parent="shared", deserved={"nvidia.com/gpu": "10"}))
    error = refused(fake, queue("b", parent="shared", deserved={"nvidia.com/gpu": "10"}))
    assert "sum of children's deserved" in error.message
    fake.create(queue("b", parent="shared", deserved={"nvidia.com/gpu": "6"}))
    error = refused(fake, queue("c", parent="shared", capability={"nvidia.com/gpu": "32"}))
    assert (
        "queue c capability[nvidia.com/gpu]=32000.00 exceeds its ancestor's capability=16000.00"
        in (error.message)
    )
    fake.create(queue("c", parent="shared", capability={"nvidia.com/gpu": "8"}))
    fake.create(queue("top", capability={"nvidia.com/gpu": "16"}))
    fake.create(queue("leaf", parent="top", capability={"nvidia.com/gpu": "8"}))  # no deserved
    code, answer = fake.request(
        "PATCH",
        "/apis/scheduling.volcano.sh/v1beta1/queues/top",
        body={"spec": {"capability": {"nvidia.com/gpu": "4"}}},
        content_type="application/merge-patch+json",
    )
    assert code == 400 and "is smaller than its descendants' max capability" in answer["message"]


def patch_queue(fake: KubeFake, name: str, spec: dict[str, Any]) -> tuple[int, Any]:
    """A merge patch of a queue's spec, the broker's kind of update."""
    return fake.request(
        "PATCH",
        f"/apis/scheduling.volcano.sh/v1beta1/queues/{name}",
        body={"spec": spec},
        content_type="application/merge-patch+json",
    )


def test_volcano_queue_quantities_are_not_negative_and_gpus_whole(fake: KubeFake) -> None:
    """validateResourceQuantityOfQueue calls Kubernetes' ValidateResourceQuantityValue on
    every capability, deserved and guarantee entry: never negative, whole for an extended
    resource; a CPU may be fractional."""
    error = refused(fake, queue("q", capability={"nvidia.com/gpu": "-1"}))
    assert error.message.endswith(
        'requestBody.spec.capability.nvidia.com/gpu: Invalid value: "-1": must be greater '
        "than or equal to 0"
    )
    error = refused(fake, queue("q", deserved={"nvidia.com/gpu": "1500m"}))
    assert error.message.endswith(
        'requestBody.spec.deserved.nvidia.com/gpu: Invalid value: "1500m": must be an integer'
    )
    fake.create(queue("q", deserved={"cpu": "500m", "nvidia.com/gpu": "2000m"}))


def test_volcano_root_queue_resources_cannot_change(fake: KubeFake) -> None:
    """AdmitQueues on UPDATE of root, with --enable-root-queue-protection (on by default,
    cmd/webhook-manager/app/options/options.go): capability, deserved and guarantee stay."""
    fake.seed(queue("root", capability={"nvidia.com/gpu": "64"}))
    code, answer = patch_queue(fake, "root", {"capability": {"nvidia.com/gpu": "32"}})
    assert code == 400 and answer["message"].endswith(
        "root queue's resource attributes (capability, deserved, guarantee) cannot be modified"
    )
    code, _ = patch_queue(fake, "root", {"weight": 2})  # not a resource: admitted
    assert code == 200


def test_volcano_queue_depth_and_a_parent_that_runs_pods(fake: KubeFake) -> None:
    """validateHierarchicalQueue, on create and on a change of parent: at most
    --max-queue-depth (5) levels below root (validateQueueDepth), and a queue whose own
    pods run cannot become a parent."""
    fake.create(queue("l1"))
    for level in range(2, 6):
        fake.create(queue(f"l{level}", parent=f"l{level - 1}"))
    error = refused(fake, queue("l6", parent="l5"))
    assert error.message.endswith("queue l6 exceeds the maximum allowed depth of 5")
    busy = fake.create(queue("busy"))
    fake.set_status(busy, {"allocated": {"pods": "2", "nvidia.com/gpu": "8"}})
    error = refused(fake, queue("child", parent="busy"))
    assert error.message.endswith(
        "queue busy cannot be the parent queue of queue child because it has allocated Pods: 2"
    )
    error = refused(fake, queue("ghost", parent="nowhere"))
    assert error.message.endswith(
        "failed to get parent queue nowhere of queue ghost: queue.scheduling.volcano.sh "
        '"nowhere" not found'
    )


def test_volcano_queue_update_checks_the_hierarchy_only_when_resources_change(
    fake: KubeFake,
) -> None:
    """needsValidateHierarchicalQueue: an update is checked against the hierarchy when its
    parent or a resource list changes, compared as quantities (equality.Semantic: "8"
    equals "8000m"). A hierarchy held from before the rules (a parent without deserved
    under a team with it) keeps its other fields changeable, but not its capability."""
    fake.seed(
        queue("training", capability={"nvidia.com/gpu": "8"}),
        queue("team", parent="training", deserved={"nvidia.com/gpu": "4"}),
    )
    assert patch_queue(fake, "training", {"weight": 3})[0] == 200
    assert patch_queue(fake, "training", {"capability": {"nvidia.com/gpu": "8000m"}})[0] == 200
    code, answer = patch_queue(fake, "training", {"capability": {"nvidia.com/gpu": "16"}})
    assert code == 400 and "sum of children's deserved" in answer["message"]


# -- Volcano: the job controller ------------------------------------------------------------

RESTART_ON_FAILURE = [
    {"event": "PodEvicted", "action": "RestartJob"},
    {"event": "PodFailed", "action": "RestartJob"},
    {"exitCode": 3, "action": "AbortJob"},
    {"event": "TaskCompleted", "action": "CompleteJob"},
]


@pytest.mark.parametrize(
    ("task_policies", "job_policies", "event", "exit_code", "action"),
    [
        # first matching policy wins, in order
        ([], RESTART_ON_FAILURE, "PodFailed", 3, "RestartJob"),
        (
            [],
            [{"exitCode": 3, "action": "AbortJob"}, *RESTART_ON_FAILURE[:2]],
            "PodFailed",
            3,
            "AbortJob",
        ),
        # within one policy the event is checked before the exit code: here both match
        ([], [{"events": ["PodFailed"], "action": "TerminateJob"}], "PodFailed", 3, "TerminateJob"),
        # task policies come before the job's
        (
            [{"exitCode": 3, "action": "CompleteJob"}],
            RESTART_ON_FAILURE,
            "PodFailed",
            3,
            "CompleteJob",
        ),
        # "*" matches every event
        ([], [{"event": "*", "action": "AbortJob"}], "PodEvicted", 0, "AbortJob"),
        # PodPending matches only a policy with a timeout
        ([], [{"event": "PodPending", "action": "AbortJob"}], "PodPending", 0, "SyncJob"),
        # internal events never reach the policies
        ([], [{"event": "*", "action": "AbortJob"}], "PodRunning", 0, "SyncJob"),
        ([], [], "PodFailed", 1, "SyncJob"),
    ],
)
def test_volcano_apply_policies(
    task_policies: list[dict[str, Any]],
    job_policies: list[dict[str, Any]],
    event: str,
    exit_code: int,
    action: str,
) -> None:
    """job_controller_util.go applyPolicies."""
    job = vcjob(policies=job_policies, task_policies=task_policies)
    assert Volcano.apply_policies(job, "worker", event, exit_code) == action


def test_volcano_restarts_until_retry_count_reaches_max_retry(volcano: KubeFake) -> None:
    """state/running.go and restarting.go: each RestartJob adds one to retryCount, and the job
    fails when a restart finds retryCount at maxRetry; maxRetry 2 ends Failed with
    retryCount 2 after one restart (test/e2e/jobp/job_restart.go)."""
    volcano.create(vcjob(policies=RESTART_ON_FAILURE, maxRetry=2))
    phases = [volcano.volcano.phase(NS, "j")]
    volcano.volcano.pods_running(NS, "j")
    phases.append(volcano.volcano.phase(NS, "j"))
    volcano.volcano.pod_failed(NS, "j", index=1, exit_code=1)
    phases.append(volcano.volcano.phase(NS, "j"))  # the other pod is still terminating
    assert volcano.volcano.job(NS, "j")["status"]["retryCount"] == 1
    volcano.pods.finish_terminating(NS)
    phases.append(volcano.volcano.phase(NS, "j"))
    pod = volcano.volcano.pod(NS, "j", index=1)
    assert pod["metadata"]["annotations"]["volcano.sh/job-retry-count"] == "1"
    volcano.volcano.pods_running(NS, "j")
    volcano.volcano.pod_failed(NS, "j", exit_code=1)
    status = volcano.volcano.job(NS, "j")["status"]
    assert phases == ["Pending", "Running", "Restarting", "Pending"]
    assert status["state"]["phase"] == "Failed" and status["retryCount"] == 2
    assert volcano.volcano.restarts[(NS, "j")] == 1


def test_volcano_actions_end_the_job_as_its_states_do(volcano: KubeFake) -> None:
    volcano.create(vcjob("abort", policies=RESTART_ON_FAILURE[2:]))
    volcano.volcano.pods_running(NS, "abort")
    volcano.volcano.pod_failed(NS, "abort", exit_code=3)
    assert volcano.volcano.phase(NS, "abort") == "Aborting"  # until its pods are gone
    volcano.pods.finish_terminating(NS)
    assert volcano.volcano.phase(NS, "abort") == "Aborted"
    volcano.create(vcjob("done", policies=RESTART_ON_FAILURE))
    volcano.volcano.pods_running(NS, "done")
    volcano.volcano.pods_succeeded(NS, "done")
    assert volcano.volcano.phase(NS, "done") == "Completed"
    # no policy: a failed pod leaves the job running until every pod has finished
    volcano.create(vcjob("plain"))
    volcano.volcano.pods_running(NS, "plain")
    volcano.volcano.pod_failed(NS, "plain", exit_code=1)
    assert volcano.volcano.phase(NS, "plain") == "Running"
    volcano.volcano.pods_succeeded(NS, "plain")
    assert volcano.volcano.phase(NS, "plain") == "Failed"  # 1 succeeded < minAvailable 2


def test_an_evicted_volcano_pod_fails_and_restarts_the_job(volcano: KubeFake) -> None:
    """An evicted pod's worker stops (PodFailed, exit 143) before the pod is gone
    (PodEvicted): the first request restarts the job, the second is of an older version."""
    volcano.create(vcjob(policies=RESTART_ON_FAILURE, maxRetry=5))
    volcano.volcano.pods_running(NS, "j")
    body = {"metadata": {"name": "j-worker-0"}}
    code, _ = volcano.request(
        "POST", f"/api/v1/namespaces/{NS}/pods/j-worker-0/eviction", body=body
    )
    assert code == 201
    assert volcano.volcano.phase(NS, "j") == "Restarting"
    volcano.pods.finish_terminating(NS)
    status = volcano.volcano.job(NS, "j")["status"]
    assert status["state"]["phase"] == "Pending" and status["retryCount"] == 1
    assert status["version"] == 1 and status["pending"] == 2


def test_volcano_svc_and_env_plugins_give_host_names_and_ranks(volcano: KubeFake) -> None:
    volcano.create(vcjob(replicas=3))
    pod = volcano.volcano.pod(NS, "j", index=2)
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("j-worker-2", "j")
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["VC_TASK_INDEX"]["value"] == env["VK_TASK_INDEX"]["value"] == "2"
    assert env["VC_WORKER_HOSTS"]["valueFrom"]["configMapKeyRef"] == {
        "name": "j-svc",
        "key": "VC_WORKER_HOSTS",
    }
    hosts = volcano.get("v1", "ConfigMap", "j-svc")["data"]
    assert hosts["VC_WORKER_HOSTS"] == "j-worker-0.j,j-worker-1.j,j-worker-2.j"
    assert hosts["VC_WORKER_NUM"] == "3"
    service = volcano.get("v1", "Service", "j")["spec"]
    assert service["clusterIP"] == "None"
    assert service["selector"] == {"volcano.sh/job-name": "j", "volcano.sh/job-namespace": NS}
    assert volcano.get("networking.k8s.io/v1", "NetworkPolicy", "j") is not None
    volcano.request("DELETE", f"/apis/batch.volcano.sh/v1alpha1/namespaces/{NS}/jobs/j")
    assert volcano.list("v1", "Pod", NS) == [] and volcano.get("v1", "Service", "j") is None


# -- JobSet and Kueue: webhooks -------------------------------------------------------------


def jobset(
    name: str = "js",
    *,
    workers: int = 2,
    rules: list[dict[str, Any]] | None = None,
    max_restarts: int = 1,
    queue_name: str | None = None,
    pod_failure_rules: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    job: dict[str, Any] = {
        "completionMode": "Indexed",
        "parallelism": workers,
        "completions": workers,
        "backoffLimit": 0,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "worker",
                        "image": "busybox",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            }
        },
    }
    if pod_failure_rules is not None:
        job["podFailurePolicy"] = {"rules": pod_failure_rules}
    labels = {"kueue.x-k8s.io/queue-name": queue_name} if queue_name else {}
    failure: dict[str, Any] = {"maxRestarts": max_restarts}
    if rules is not None:
        failure["rules"] = rules
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "failurePolicy": failure,
            "replicatedJobs": [{"name": "worker", "replicas": 1, "template": {"spec": job}}],
            **spec,
        },
    }


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("unhealthyTraining", True),
        ("rule_1", True),
        ("a:b,c_", True),
        ("R", True),
        ("unhealthy-training", False),
        ("1rule", False),
        ("rule:", False),
        ("", False),
    ],
)
def test_jobset_failure_policy_rule_names(fake: KubeFake, name: str, valid: bool) -> None:
    """jobset_webhook.go validateFailurePolicy: ruleNameFmt ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$
    (an empty name is first defaulted to failurePolicyRule<N> by Default)."""
    rules = [{"name": name, "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]
    if valid or name == "":
        created = fake.create(jobset(rules=rules))
        assert created["spec"]["failurePolicy"]["rules"][0]["name"] == (
            name or "failurePolicyRule0"
        )
        return
    error = refused(fake, jobset(rules=rules))
    assert error.code == 422 and error.reason == "Invalid"
    assert error.message.startswith(
        'admission webhook "vjobset.kb.io" denied the request: JobSet.jobset.x-k8s.io "js" is '
        f"invalid: <nil>: Internal error: invalid failure policy rule name '{name}'"
    )


def test_jobset_webhook_rules(fake: KubeFake) -> None:
    """jobset_webhook.go ValidateCreate: unique rule names, known job failure reasons and
    targets, RestartJob behind its feature gate, the longest pod name a DNS-1035 label."""
    twice = [{"name": "a", "action": "FailJobSet"}, {"name": "a", "action": "RestartJobSet"}]
    assert (
        "rule names are not unique, rules with indices [0 1]"
        in refused(fake, jobset(rules=twice)).message
    )
    reason = [{"name": "a", "action": "FailJobSet", "onJobFailureReasons": ["Evicted"]}]
    assert "invalid job failure reason 'Evicted'" in refused(fake, jobset(rules=reason)).message
    target = [{"name": "a", "action": "FailJobSet", "targetReplicatedJobs": ["leader"]}]
    assert "invalid replicatedJob name 'leader'" in refused(fake, jobset(rules=target)).message
    gated = [{"name": "a", "action": "RestartJob"}]
    assert "RestartJob feature gate is disabled" in refused(fake, jobset(rules=gated)).message
    # <name>-worker-0-<workers-1>-abcde must fit 63 characters
    name = "j" * 47
    error = refused(fake, jobset(name, workers=10))
    assert error.message.endswith(
        f'spec.replicatedJobs[0].name: Invalid value: "{name}-worker-0": JobSet name is too '
        "long, pod names generated for this JobSet will exceed 63 characters"
    )
    fake.create(jobset(name[:-1], workers=10))  # <46 characters>-worker-0-9-abcde is 63
    created = fake.create(jobset("defaults"))
    spec = created["spec"]
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert spec["successPolicy"] == {"operator": "All"}
    assert spec["replicatedJobs"][0]["groupName"] == "default"  # the CRD's default
    assert spec["failurePolicy"]["restartStrategy"] == "Recreate"


def test_kueue_suspends_a_jobset_naming_a_queue_and_checks_the_name(fake: KubeFake) -> None:
    """kueue jobset_webhook.go Default (ApplyDefaultForSuspend) and validateCreate."""
    assert fake.create(jobset("queued", queue_name="team"))["spec"]["suspend"] is True
    assert "suspend" not in fake.create(jobset("free"))["spec"]
    error = refused(fake, jobset("bad", queue_name="Team_A"))
    assert error.code == 403 and error.reason == "Forbidden"
    assert error.message.startswith(
        'admission webhook "vjobset.kb.io" denied the request: '
        'metadata.labels[kueue.x-k8s.io/queue-name]: Invalid value: "Team_A": a lowercase RFC '
        "1123 subdomain"
    )


def test_a_jobset_spec_is_immutable_except_placement_while_suspended(fake: KubeFake) -> None:
    fake.create(jobset(queue_name="team"))
    path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets/js"
    merge = "application/merge-patch+json"
    placement = {"nodeSelector": {"pool": "a"}}
    patch = {"spec": {"replicatedJobs": [copy.deepcopy(jobset()["spec"]["replicatedJobs"][0])]}}
    patch["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"].update(placement)
    current = fake.get("jobset.x-k8s.io/v1alpha2", "JobSet", "js")
    wanted = copy.deepcopy(current)
    wanted["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"].update(placement)
    code, _ = fake.request("PUT", path, body=wanted)
    assert code == 200
    wanted = fake.get("jobset.x-k8s.io/v1alpha2", "JobSet", "js")
    wanted["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 3
    code, answer = fake.request("PUT", path, body=wanted)
    assert code == 422 and "field is immutable" in answer["message"]
    code, answer = fake.request(
        "PATCH", path, body={"spec": {"failurePolicy": {"maxRestarts": 7}}}, content_type=merge
    )
    assert code == 422 and "Value is immutable" in answer["message"]  # the CRD's CEL rule


# -- JobSet: the controller ------------------------------------------------------------------

DISRUPTED = {
    "action": "FailJob",
    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
}
EXIT_9 = {
    "action": "FailJob",
    "onExitCodes": {"containerName": "worker", "operator": "In", "values": [9]},
}


def test_jobset_failure_policy_first_match_and_restart_counting(fake: KubeFake) -> None:
    """failure_policy.md: the first matching rule acts; no match means RestartJobSet, which
    counts towards maxRestarts; RestartJobSetAndIgnoreMaxRestarts does not count;
    FailJobSet fails at once; past maxRestarts the JobSet fails."""
    rules = [
        {
            "name": "fatal",
            "action": "FailJobSet",
            "onJobFailureReasons": ["PodFailurePolicy"],
            "onJobFailureMessagePatterns": ["rule at index 0"],
        },
        {
            "name": "free",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["PodFailurePolicy"],
        },
    ]
    fake.create(jobset(rules=rules, max_restarts=1, pod_failure_rules=[EXIT_9, DISRUPTED]))
    fake.jobset.pods_running(NS, "js")
    status = fake.jobset.jobset(NS, "js")["status"]
    assert status["replicatedJobsStatus"][0]["active"] == 1
    # a disrupted pod: pod failure rule 1 -> the "free" rule: restart, not counted
    victim = fake.jobset.pod(NS, "js", index=1)
    code, _ = fake.request(
        "POST", f"/api/v1/namespaces/{NS}/pods/{victim['metadata']['name']}/eviction", body={}
    )
    assert code == 201
    status = fake.jobset.jobset(NS, "js")["status"]
    assert (status["restarts"], status.get("restartsCountTowardsMax", 0)) == (1, 0)
    # a crash: no rule -> RestartJobSet, counted
    fake.jobset.pods_running(NS, "js")
    fake.jobset.pod_failed(NS, "js", exit_code=1)
    status = fake.jobset.jobset(NS, "js")["status"]
    assert (status["restarts"], status["restartsCountTowardsMax"]) == (2, 1)
    # again: maxRestarts 1 is used up
    fake.jobset.pods_running(NS, "js")
    fake.jobset.pod_failed(NS, "js", exit_code=1)
    failed = fake.jobset.jobset(NS, "js")["status"]
    assert failed["terminalState"] == "Failed"
    (condition,) = [c for c in failed["conditions"] if c["type"] == "Failed"]
    assert condition["reason"] == "ReachedMaxRestarts"
    # exit 9 matches pod failure rule 0 -> "fatal": FailJobSet
    fake.create(jobset("other", rules=rules, pod_failure_rules=[EXIT_9, DISRUPTED]))
    fake.jobset.pods_running(NS, "other")
    fake.jobset.pod_failed(NS, "other", exit_code=9)
    status = fake.jobset.jobset(NS, "other")["status"]
    assert status["restarts"] == 0 and status["terminalState"] == "Failed"


def test_a_child_job_failure_reason_picks_the_rule(fake: KubeFake) -> None:
    rules = [
        {"name": "deadline", "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]}
    ]
    fake.create(jobset(rules=rules, max_restarts=3))
    fake.jobset.job_failed(NS, "js", reason="BackoffLimitExceeded")
    assert fake.jobset.jobset(NS, "js")["status"]["restarts"] == 1
    fake.jobset.job_failed(NS, "js", reason="DeadlineExceeded")
    assert fake.jobset.jobset(NS, "js")["status"]["terminalState"] == "Failed"


def test_a_jobset_completes_when_every_job_does(fake: KubeFake) -> None:
    fake.create(jobset())
    fake.jobset.pods_running(NS, "js")
    fake.jobset.pods_succeeded(NS, "js")
    status = fake.jobset.jobset(NS, "js")["status"]
    assert status["terminalState"] == "Completed"
    assert status["replicatedJobsStatus"][0]["succeeded"] == 1


def test_jobset_pods_get_host_names_under_the_subdomain_and_their_index(fake: KubeFake) -> None:
    fake.create(jobset(network={"enableDNSHostnames": True, "subdomain": "gang"}))
    pod = fake.jobset.pod(NS, "js", index=1)
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("js-worker-0-1", "gang")
    assert pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1"
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert "JOB_COMPLETION_INDEX" in env
    assert fake.get("v1", "Service", "gang")["spec"]["clusterIP"] == "None"


# -- Kueue: admission by quota ---------------------------------------------------------------


def kueue_queues(
    fake: KubeFake, *, gpus: int, borrow: int | None = None, cohort: str | None = "all"
) -> None:
    fake.create(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "gpu"},
            "spec": {"nodeLabels": {"pool": "gpu"}},
        }
    )
    resource: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": gpus}
    if borrow is not None:
        resource["borrowingLimit"] = borrow
    for name, quota in (
        ("team", resource),
        ("lender", {"name": "nvidia.com/gpu", "nominalQuota": 4}),
    ):
        fake.create(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {
                    **({"cohortName": cohort} if cohort else {}),
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["nvidia.com/gpu"],
                            "flavors": [{"name": "gpu", "resources": [quota]}],
                        }
                    ],
                },
            }
        )
    fake.create(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "team", "namespace": NS},
            "spec": {"clusterQueue": "team"},
        }
    )


def test_kueue_admits_a_suspended_jobset_by_quota(fake: KubeFake) -> None:
    kueue_queues(fake, gpus=2, cohort=None)  # nothing to borrow
    fake.create(jobset("a", queue_name="team"))
    assert fake.jobs.pods(fake.jobset.jobs(fake.jobset.jobset(NS, "a"))[0]) == []  # suspended
    assert fake.kueue.admit(NS, "a") == {"nvidia.com/gpu": "gpu"}
    admitted = fake.jobset.jobset(NS, "a")
    assert admitted["spec"]["suspend"] is False
    template = admitted["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert template["nodeSelector"] == {"pool": "gpu"}  # the flavor's node labels
    suspended = next(c for c in admitted["status"]["conditions"] if c["type"] == "Suspended")
    assert suspended["status"] == "False"
    assert len(fake.jobs.pods(fake.jobset.jobs(admitted)[0])) == 2
    fake.create(jobset("b", queue_name="team"))
    with pytest.raises(NotAdmittedError, match=r"insufficient quota for nvidia\.com/gpu"):
        fake.kueue.admit(NS, "b")  # 2 + 2 > nominalQuota 2
    fake.jobset.pods_running(NS, "a")
    fake.jobset.pods_succeeded(NS, "a")  # finished: its quota is released
    fake.kueue.admit(NS, "b")


def test_kueue_borrows_within_the_cohort_up_to_the_limit(fake: KubeFake) -> None:
    kueue_queues(fake, gpus=0, borrow=2)
    fake.create(jobset("a", queue_name="team"))
    fake.kueue.admit(NS, "a")  # 2 GPUs borrowed from "lender"
    fake.create(jobset("b", queue_name="team"))
    with pytest.raises(NotAdmittedError):
        fake.kueue.admit(NS, "b")  # borrowingLimit 2
    fake.create(jobset("c", queue_name="nobody"))
    with pytest.raises(NotAdmittedError, match="LocalQueue nobody doesn't exist"):
        fake.kueue.admit(NS, "c")


def test_without_upstream_schemas_the_fake_skips_saying_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A clone without ../shared (a user's): every test that needs a custom resource's
    upstream schema skips with the path it needs, rather than erroring at setup."""
    from tests.kubefake import schemas

    monkeypatch.setattr(schemas, "SCHEMAS", tmp_path / "absent")
    schemas._crd.cache_clear()
    try:
        with pytest.raises(pytest.skip.Exception, match=r"needs the upstream CRD .*absent"):
            schemas._crd("volcano/scheduling.volcano.sh_queues.yaml")
    finally:
        schemas._crd.cache_clear()
