"""Kubernetes names and label values from free-form ids (DAG run ids, step names)."""

from __future__ import annotations

from tideflow.storage.keys import dns_label

__all__ = ["dns_label", "gang_name_limit", "gang_object_name"]


# A gang has at most 4096 workers (the spec's bound), so its largest index has 4 digits.
_INDEX_DIGITS = 4
# The longest name each gang scheduler derives from the object's name, beyond it:
# * Volcano names pod i of task "worker" <job>-worker-<i> and gives it that host name
#   (volcano pkg/controllers/job/job_controller_util.go MakePodName; svc plugin), a
#   DNS-1123 label.
# * JobSet names pod i of job j <jobset>-<replicatedJob>-<j>-<i>-<5 random chars>, and
#   its webhook refuses a JobSet whose longest such name is not a DNS-1035 label
#   (jobset pkg/webhooks/jobset_webhook.go, placement.GenPodName + "-abcde").
_DERIVED_SUFFIX = {
    "volcano": len("-worker-") + _INDEX_DIGITS,
    "kueue": len("-worker-0-") + _INDEX_DIGITS + len("-abcde"),
}


def gang_name_limit(scheduler: str) -> int:
    """How long a gang object's name may be so every name derived from it is a label."""
    return 63 - _DERIVED_SUFFIX[scheduler]


def gang_object_name(gang_id: str, scheduler: str = "volcano") -> str:
    """A gang's Volcano Job or JobSet name: from its id, so every attempt finds the same one.

    Capped per scheduler (``gang_name_limit``) so the pod names and host names the
    scheduler derives stay within 63 characters for any worker count the spec allows.
    """
    return dns_label(gang_id, limit=gang_name_limit(scheduler))
