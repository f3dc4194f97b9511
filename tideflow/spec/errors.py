"""Errors a user sees when a pipeline or cluster file is wrong.

Every problem is reported as ``FILE:LINE:COL: FIELD: what is wrong; what is
accepted`` so editors and CI logs can jump straight to it. A file's problems are
collected and raised together: fixing a pipeline should not be a loop of
"fix one error, run again, see the next one".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class SpecIssue:
    """One problem found in a spec file, located as precisely as the YAML allows."""

    file: str
    line: int
    column: int
    field: str
    problem: str
    accepted: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}"
        field = self.field or "(document)"
        text = f"{where}: {field}: {self.problem}"
        if self.accepted:
            text += f"; {self.accepted}"
        return text


class SpecError(Exception):
    """A spec file has one or more problems; ``issues`` lists all of them."""

    def __init__(self, file: str, issues: Iterable[SpecIssue]) -> None:
        self.file = file
        self.issues: tuple[SpecIssue, ...] = tuple(sorted(set(issues)))
        count = len(self.issues)
        header = f"{file}: {count} problem{'s' if count != 1 else ''}"
        super().__init__("\n".join([header, *(str(issue) for issue in self.issues)]))
