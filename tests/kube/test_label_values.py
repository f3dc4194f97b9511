"""Label values and object names made from free-form ids (``dns_label``): valid
Kubernetes label values and DNS labels whatever the id, and never one value for two ids."""

from __future__ import annotations

import re

import pytest

from tideflow.kube.names import dns_label

LABEL_VALUE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@pytest.mark.parametrize(
    "text", ["__", "...", "-", "_-_", "-" * 80, "Vision_Team", "manual__2026-11-23T12:00:00+00:00"]
)
def test_a_label_value_starts_and_ends_alphanumeric_whatever_the_id(text: str) -> None:
    # An id with no letter or digit (an Airflow run id may be "__") gave "-<hash>",
    # which Kubernetes refuses as a label value and as an object name.
    value = dns_label(text)
    assert LABEL_VALUE.fullmatch(value) and len(value) <= 63
    shorter = dns_label(text, limit=40)  # a gang object's name has less room
    assert LABEL_VALUE.fullmatch(shorter) and len(shorter) <= 40


def test_ids_without_letters_or_digits_stay_apart() -> None:
    assert len({dns_label("__"), dns_label("..."), dns_label("-"), dns_label("")}) == 4
