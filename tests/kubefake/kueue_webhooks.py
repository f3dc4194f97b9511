"""Kueue's ClusterQueue and Cohort validating webhooks, reimplemented from their source.

kubernetes-sigs/kueue pkg/webhooks/clusterqueue_webhook.go (ValidateClusterQueue,
validateResourceGroups, validateFlavorQuotas, validateLimit, validateLendingLimit,
validatePreemption), cohort_webhook.go (validateCohort) and common.go
(validateResourceName, validationConfig), read at 3aab69f (ClusterQueue) and 00caa31
(Cohort). The CRD schema and its CEL rules (schemas.py) run first, as in the API
server; these are the rules only the webhook holds:

* each covered resource and each flavor in one resource group only;
* a flavor's resources named as coveredResources, in that order;
* nominalQuota, borrowingLimit and lendingLimit not negative;
* borrowingLimit and lendingLimit only in a cohort (a Cohort: only with a parent);
* a ClusterQueue's lendingLimit at most its nominalQuota (not checked for a Cohort:
  ``enforceNominalGreaterThanLending: false``);
* no borrowWithinCohort other than Never while reclaimWithinCohort is Never.

controller-runtime's CustomValidator answers a plain error with ``admission.Denied``:
HTTP 403, the field errors aggregated (one: its text; several: ``[a, b]``).
Not reproduced: label-selector syntax and admission-check strategies (tideflow sets
neither beyond ``matchLabels``).
"""

from __future__ import annotations

import re
from typing import Any

from tests.kubefake.quantity import quantity

CLUSTER_QUEUE_VALIDATE = "vclusterqueue.kb.io"
COHORT_VALIDATE = "vcohort.kb.io"
LIMIT_IS_EMPTY = "must be nil when {} is empty"
LENDING_LIMIT = "must be less than or equal to the nominalQuota"
NEGATIVE = "must be greater than or equal to 0"  # apimachinery IsNegativeErrorMsg
# k8s.io/apimachinery pkg/util/validation IsQualifiedName: [prefix/]name, name 63 at most
_QUALIFIED = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def _invalid(path: str, value: Any, why: str) -> str:
    return f'{path}: Invalid value: "{value}": {why}'


def _resource_groups(
    groups: list[dict[str, Any]], *, has_parent: bool, enforce_lending: bool, is_cohort: bool
) -> list[str]:
    """validateResourceGroups and validateFlavorQuotas."""
    errors: list[str] = []
    seen_resources: set[str] = set()
    seen_flavors: set[str] = set()
    for i, group in enumerate(groups):
        path = f"spec.resourceGroups[{i}]"
        covered = list(group.get("coveredResources") or [])
        for j, name in enumerate(covered):
            if not _QUALIFIED.match(name):
                errors.append(
                    _invalid(f"{path}.coveredResources[{j}]", name, "not a qualified name")
                )
            if name in seen_resources:
                errors.append(f'{path}.coveredResources[{j}]: Duplicate value: "{name}"')
            seen_resources.add(name)
        for j, flavor in enumerate(group.get("flavors") or []):
            fpath = f"{path}.flavors[{j}]"
            for k, quota in enumerate((flavor.get("resources") or [])[: len(covered)]):
                qpath = f"{fpath}.resources[{k}]"
                if quota.get("name") != covered[k]:
                    errors.append(
                        _invalid(
                            f"{qpath}.name",
                            quota.get("name"),
                            "must match the name in coveredResources",
                        )
                    )
                nominal = quota.get("nominalQuota", 0)
                if quantity(nominal) < 0:
                    errors.append(_invalid(f"{qpath}.nominalQuota", nominal, NEGATIVE))
                where = "parent" if is_cohort else "cohort"
                if "borrowingLimit" in quota:
                    limit = quota["borrowingLimit"]
                    if not has_parent:
                        errors.append(
                            _invalid(f"{qpath}.borrowingLimit", limit, LIMIT_IS_EMPTY.format(where))
                        )
                    if quantity(limit) < 0:
                        errors.append(_invalid(f"{qpath}.borrowingLimit", limit, NEGATIVE))
                if "lendingLimit" in quota:  # the LendingLimit feature gate: on by default
                    limit = quota["lendingLimit"]
                    if quantity(limit) < 0:
                        errors.append(_invalid(f"{qpath}.lendingLimit", limit, NEGATIVE))
                    if not has_parent:
                        errors.append(
                            _invalid(f"{qpath}.lendingLimit", limit, LIMIT_IS_EMPTY.format(where))
                        )
                    if enforce_lending and quantity(limit) > quantity(nominal):
                        errors.append(_invalid(f"{qpath}.lendingLimit", limit, LENDING_LIMIT))
            name = flavor.get("name")
            if name in seen_flavors:
                errors.append(f'{fpath}.name: Duplicate value: "{name}"')
            seen_flavors.add(name)
    return errors


def _aggregate(errors: list[str]) -> str:
    """utilerrors.NewAggregate(...).Error()."""
    return errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"


def validate_cluster_queue(cq: dict[str, Any]) -> str:
    """ValidateClusterQueue (the same on create and update): the refusal, or ""."""
    spec = cq.get("spec") or {}
    errors = _resource_groups(
        spec.get("resourceGroups") or [],
        has_parent=bool(spec.get("cohortName")),
        enforce_lending=True,
        is_cohort=False,
    )
    preemption = spec.get("preemption")
    if preemption is not None:
        borrow = preemption.get("borrowWithinCohort")
        if (
            preemption.get("reclaimWithinCohort", "Never") == "Never"
            and borrow is not None
            and borrow.get("policy", "Never") != "Never"
        ):
            errors.append(
                _invalid(
                    "spec.preemption",
                    "",
                    "reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never",
                )
            )
    return _aggregate(errors) if errors else ""


def validate_cohort(cohort: dict[str, Any]) -> str:
    """validateCohort: the resource groups, limits only under a parent Cohort."""
    spec = cohort.get("spec") or {}
    errors = _resource_groups(
        spec.get("resourceGroups") or [],
        has_parent=bool(spec.get("parentName")),
        enforce_lending=False,
        is_cohort=True,
    )
    return _aggregate(errors) if errors else ""
