"""A FAKE Kubernetes API server: the one fake every Kubernetes test in tideflow talks to.

No API server, Volcano, JobSet or Kueue can run on this machine, so this package
plays them, over HTTP on 127.0.0.1, for the real ``kubernetes`` and
``kubernetes_asyncio`` clients. It is a fake: it reproduces the behaviour listed
here from the upstream sources and documentation in ../shared/reference
(volcano @ ed72c7c, jobset @ 08dfbdf, kueue @ ff69552, argo-workflows @ f016ad8;
Kubernetes itself from its documentation), each rule in its own function citing
where it comes from, and nothing more.

What it reproduces
  * store (store.py): objects by group/resource/namespace/name, monotonic
    resourceVersions, create (409 AlreadyExists), get / 404, list and watch with
    labelSelector and fieldSelector, watch from a resourceVersion with a
    configurable retention window (410 Gone when older; ``compact()``), update
    and patch (merge, JSON and strategic merge patch, patches.py), delete with
    propagationPolicy and the garbage collector's cascade (api.py);
  * the pods/eviction subresource with PodDisruptionBudgets (eviction.py), the
    Deployment scale subresource, the status subresource for controllers;
    graceful deletion of running pods (pods.py: Terminating, with the
    DisruptionTarget condition when evicted, until the test finishes them);
  * admission (admission.py): every object's name and labels by the API
    server's ObjectMeta rules (object_meta.py); CRD schemas with structural defaults and
    x-kubernetes-validations CEL rules, core kinds with kubernetes-validate,
    strictly (schemas.py); NamespaceLifecycle, Priority and
    ValidatingAdmissionPolicies from deploy/ (core_admission.py); Volcano's Job
    mutating and validating webhooks and its Queue webhook
    (volcano_webhooks.py); the JobSet webhook and Kueue's JobSet webhook
    (jobset_webhooks.py). Refusals carry the code and Status body upstream
    answers with (status.py);
  * authorization (rbac.py): every request is made as an identity (a bearer
    token the fake maps to a user name); Roles, ClusterRoles and bindings are
    read from deploy/kubernetes/*.yaml and anything they do not grant is a 403;
    ``fake.rbac.unused(user, namespace)`` lists the grants nothing used;
  * controllers, moved by the test, never by themselves (no background thread
    but the HTTP server's): Volcano's job and queue controllers (volcano.py),
    the JobSet and Job controllers (jobset.py), Kueue's admission by quota
    (kueue.py), and the scheduler and kubelets as far as pod phases go (pods.py).

What it does NOT do
  Argo (its controller, Workflow objects; a test runs a compiled step's
  container itself, tests/argo_run.py), scheduling or any placement decision,
  running containers, DNS, networking,
  resource accounting on nodes, PodGroups and gang scheduling, the disruption
  controller (a test writes a budget's status), Workload objects, preemption
  and fair sharing in Kueue, finalizers (objects other than running pods go at
  once; Foreground deletion removes the owner first), the controllers' own
  RBAC, server-side apply, field managers, core defaulting, semantic
  validation of built-in kinds beyond their OpenAPI schema, admission chains
  beyond the rules named above, API discovery, authentication beyond bearer
  tokens, and any behaviour of a Kubernetes version other than the one its
  rules were read from. Where a rule was written from memory of an upstream
  file that is not in the reference, its comment says so.

``fake.seed(...)`` stores objects the cluster already holds without webhooks or
RBAC (for state a test is not about, such as the Volcano team queues a
test of something else needs); everything else goes through ``fake.create`` or
the real clients, and so through admission and authorization.

Usage::

    with KubeFake() as fake:               # namespace "tideflow", RBAC from deploy/
        fake.seed(DEPLOY / "volcano-queues.yaml")
        api = fake.client(service_account("tideflow", "tideflow-airflow-worker"))
        ...                                 # tideflow code with the real client
        fake.volcano.pods_running("tideflow", name)   # the scheduler and kubelets
        fake.volcano.pod_failed("tideflow", name, index=1, exit_code=76)
        fake.pods.finish_terminating("tideflow")      # killed pods leave the API
        assert [r.code for r in fake.requests_by(user)] == [...]
"""

from collections.abc import Iterator
from contextlib import contextmanager

from tests.kubefake.fake import DEPLOY, KubeFake, Logged
from tests.kubefake.rbac import ADMIN, service_account
from tests.kubefake.status import ApiError
from tideflow.kube.volcano import EXIT_PREEMPTED


@contextmanager
def gang_cluster() -> Iterator[KubeFake]:
    """A fake holding what a gang needs: deploy/'s PriorityClasses (created) and Volcano
    team queues (seeded), with workers that do as tideflow's runtime does when their pod
    is stopped: write a checkpoint and exit 75 (EXIT_PREEMPTED)."""
    with KubeFake() as fake:
        fake.apply(DEPLOY / "priority-classes.yaml")
        fake.seed(DEPLOY / "volcano-queues.yaml")
        fake.pods.termination_exit_code = EXIT_PREEMPTED
        yield fake


__all__ = [
    "ADMIN",
    "DEPLOY",
    "ApiError",
    "KubeFake",
    "Logged",
    "gang_cluster",
    "service_account",
]
