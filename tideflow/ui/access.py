"""Who sees what on the tideflow page.

The plugin asks Airflow's auth manager about the caller once per request and
hands the answers over as a ``Viewer``; every panel keeps only the rows the
viewer may see. A row that cannot be tied to something the viewer may read
is left out (deny by default).

=================  ==============================================================
panel              shown to the caller when
=================  ==============================================================
pipelines          the DAG is tagged ``tideflow`` and is among the DAGs Airflow's
                   ``get_authorized_dag_ids(method="GET")`` returns for the caller
                   (their recent runs and MLflow parent runs with them)
champions          the champion version's ``tideflow.dag_id`` tag (the DAG that
                   produced it) is such a DAG; a version without that tag (a model
                   registered by hand) is shown to nobody
leases now         a gang's lease: its gang id is ``dag_id/run_id/task_id`` and
                   that DAG is readable; the broker's inference reservations
                   (``broker/inference/N``): the caller may see the broker (below);
                   any other lease (no DAG in its id) is shown to nobody
device-hours       a team's row: the caller may read at least one tideflow DAG of
                   that team (the DAG's ``team:<team>`` tag); the broker's own
                   team (``inference``): the caller may see the broker
teams              a team's quota rows (quota, in use, borrowed, lent, this month's
                   device-hours and budget): as device-hours
queue              a waiting gang: as a lease (its DAG is readable)
preemption         an entry (asked to stop, preempted, forced): as a lease
journal
reasons            in the queue and the journal, a gang the caller may not see (as
                   a lease) is replaced by "a gang you may not see", and what the
                   reason says of it in parentheses (team, holder) is dropped; the
                   quota numbers and the lending teams it names are shown
GPU broker         Airflow's auth manager answers ``is_authorized_custom_view(
                   method="GET", resource_name="tideflow-broker")`` with True
problems           always; a champion that failed to be read is named only when
                   its DAG is readable, otherwise it is counted without a name
=================  ==============================================================

With Airflow's simple auth manager every user with a role may read every DAG
and every custom view, so everyone logged in sees everything; auth managers
with real rights (FAB, Keycloak, ...) grant ``tideflow-broker`` like any other
custom view, and a user they do not grant it to does not see the broker.
Known limit: device-hours are kept per team, not per DAG, so a reader of one
DAG of a team sees the hours of all that team's gangs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BROKER_VIEW = "tideflow-broker"  # the custom view (resource name) that shows the broker


@dataclass(frozen=True)
class Viewer:
    """What the caller may read, as the plugin learned it from Airflow's auth manager."""

    dag_ids: frozenset[str]  # DAGs the caller may read
    teams: frozenset[str]  # teams of the readable tideflow DAGs
    broker: bool  # may see the GPU broker


def _broker_reservation(gang_id: str) -> bool:
    from tideflow.broker.local import INFERENCE_PREFIX

    return gang_id.startswith(INFERENCE_PREFIX)


def dag_of_gang(gang_id: str) -> str | None:
    """The DAG of a gang id ``dag_id/run_id/task_id`` (DAG ids hold no '/'); None otherwise."""
    if _broker_reservation(gang_id):
        return None
    parts = gang_id.split("/")
    if len(parts) < 3 or not all(parts):
        return None
    return parts[0]


def may_see_dag(viewer: Viewer, dag_id: str | None) -> bool:
    return dag_id is not None and dag_id in viewer.dag_ids


def may_see_lease(viewer: Viewer, gang_id: str) -> bool:
    if _broker_reservation(gang_id):
        return viewer.broker
    return may_see_dag(viewer, dag_of_gang(gang_id))


def may_see_team(viewer: Viewer, team: str) -> bool:
    from tideflow.broker.local import INFERENCE_TEAM

    if team in viewer.teams:
        return True
    return team == INFERENCE_TEAM and viewer.broker


HIDDEN_GANG = "a gang you may not see"
# A gang id in a scheduling reason, PIPELINE/RUN/STEP (run ids hold ':' and '+'), ended
# by a space, a comma, a semicolon or a parenthesis; then, maybe, what the ledger says of
# that gang in parentheses: "(team T, 2 device(s), holder H, for 30s)".
_GANG_IN_TEXT = re.compile(
    r"([^\s,;()/]+/[^\s,;()/]+/[^\s,;()]+)((?:\s\((?:[^()]|\([^()]*\))*\))?)"
)


def redact(text: str, viewer: Viewer) -> str:
    """``text`` (a reason the ledger wrote) with each gang ``viewer`` may not see (as a
    lease) replaced, with what the text says of it in parentheses (its team, holder and
    devices): a reason names the gangs that hold devices, wait ahead or are stopped,
    whoever's they are."""

    def hide(match: re.Match[str]) -> str:
        token = match.group(1)
        gang_id = token.rstrip(".:")
        if may_see_lease(viewer, gang_id):
            return match.group(0)
        return HIDDEN_GANG + token[len(gang_id) :]

    return _GANG_IN_TEXT.sub(hide, text)
