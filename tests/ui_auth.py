"""A TEST auth manager: Airflow's simple auth manager plus per-DAG and per-view denials.

Why it exists: Airflow's ``SimpleAuthManager`` grants by role only (every
VIEWER may read every DAG, every custom view), so it cannot show whether the
tideflow page hides what a user may not read. This subclass keeps everything
of the simple auth manager (users and passwords from ``[core]
simple_auth_manager_users``, ``POST /auth/token``, the login page, JWTs) and
only takes rights away: the users in ``DENIED_DAGS`` may not read those DAGs
(Airflow's own REST API answers 403 for them, and ``get_authorized_dag_ids``
leaves them out), and the users in ``DENIED_VIEWS`` may not see those custom
views. Tests select it with
``AIRFLOW__CORE__AUTH_MANAGER=tests.ui_auth.DagRightsTestAuthManager``.
It is for tests only; never configure it anywhere else.
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

# user -> DAG ids that user may not read (nor do anything else with)
DENIED_DAGS: dict[str, frozenset[str]] = {"reader": frozenset({"ui-secret"})}
# user -> custom views (resource names) that user may not see; "tideflow-broker" is the
# view the tideflow page asks about before it shows the GPU broker
DENIED_VIEWS: dict[str, frozenset[str]] = {"reader": frozenset({"tideflow-broker"})}


class DagRightsTestAuthManager(SimpleAuthManager):
    """Test auth manager (see the module docstring): the simple auth manager with denials."""

    def is_authorized_dag(
        self,
        *,
        method: Any,
        user: Any,
        access_entity: Any = None,
        details: Any = None,
    ) -> bool:
        if details is not None and details.id in DENIED_DAGS.get(user.get_id(), frozenset()):
            return False
        return bool(
            super().is_authorized_dag(
                method=method, user=user, access_entity=access_entity, details=details
            )
        )

    def is_authorized_custom_view(self, *, method: Any, resource_name: str, user: Any) -> bool:
        if resource_name in DENIED_VIEWS.get(user.get_id(), frozenset()):
            return False
        return bool(
            super().is_authorized_custom_view(method=method, resource_name=resource_name, user=user)
        )
