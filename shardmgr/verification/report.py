"""What a verify run found: :class:`Report`, and the exit status it gives
(docs/verify.md). Apart from the run (runner.py) so that the checks that
build reports (cluster_checks.py) and the views that print them import it
without importing the run."""

from __future__ import annotations

import dataclasses

from common.journal.check import Problem, Severity

EXIT_CLEAN, EXIT_REPAIRABLE, EXIT_CORRUPT, EXIT_CANNOT_RUN = 0, 1, 2, 3


@dataclasses.dataclass(slots=True)
class Report:
    """What a verify run found."""

    data_dir: str
    deep: bool
    problems: list[Problem]
    files: int
    bytes_read: int
    seconds: float
    repaired: list[str] = dataclasses.field(default_factory=list)
    #: ``--cluster``: the etcd and object-store URLs checked ("" for none; docs/verify.md)
    cluster: str = ""

    @property
    def exit_code(self) -> int:
        """2 if a rule found corruption; else 3 if some unit could not be
        checked (``check_failed``: no verdict on it); else 1 or 0."""
        judged = [p.severity for p in self.problems if p.what != "check_failed"]
        worst = max(judged, default=Severity.NOTE)
        if worst == Severity.CORRUPT:
            return EXIT_CORRUPT
        if len(judged) < len(self.problems):
            return EXIT_CANNOT_RUN
        return EXIT_REPAIRABLE if worst == Severity.REPAIRABLE else EXIT_CLEAN

    def count(self, severity: Severity) -> int:
        return sum(p.severity == severity for p in self.problems)

    def as_dict(self) -> dict[str, object]:
        return {"data_dir": self.data_dir, "deep": self.deep, "exit_code": self.exit_code, "files": self.files,
                "bytes_read": self.bytes_read, "seconds": round(self.seconds, 6),
                "counts": {s.name.lower(): self.count(s) for s in Severity},
                "problems": [p.as_dict() for p in self.problems], "repaired": self.repaired,
                "cluster": self.cluster or None}

    def joined(self, other: Report) -> Report:
        """One report of two runs (a data directory's and a cluster's): every
        finding of both, so the exit status is the worse verdict."""
        return Report(self.data_dir or other.data_dir, self.deep or other.deep, self.problems + other.problems,
                      self.files + other.files, self.bytes_read + other.bytes_read, self.seconds + other.seconds,
                      self.repaired + other.repaired, self.cluster or other.cluster)
