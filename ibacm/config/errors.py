"""Problems found in configuration files, reported with the file name and line number.

Parsers never raise for bad content: they return the settings they could use plus a list of
``ConfigIssue``. ``ConfigError`` is for callers that must stop (e.g. a file that exists but
cannot be read when strict loading was asked for).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Severity = Literal["warning", "error"]


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a configuration file; ``line`` is 1-based (0 = the file as a whole)."""

    path: str
    line: int
    message: str
    severity: Severity

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


class ConfigError(Exception):
    """Fatal configuration problems; ``issues`` holds every problem that led to it."""

    def __init__(self, issues: Iterable[ConfigIssue]) -> None:
        self.issues: list[ConfigIssue] = list(issues)
        text = "; ".join(str(issue) for issue in self.issues) or "configuration error"
        super().__init__(text)


def errors_in(issues: Iterable[ConfigIssue]) -> list[ConfigIssue]:
    """The error-severity issues of ``issues`` (what strict callers turn into ConfigError)."""
    return [issue for issue in issues if issue.severity == "error"]


def invalid_settings(issues: Iterable[ConfigIssue]) -> str:
    """The lines with an error among ``issues``, each counted once: "2 invalid settings"."""
    count = len({(issue.path, issue.line) for issue in errors_in(issues)})
    return f"{count} invalid setting{'' if count == 1 else 's'}"


class IssueSink:
    """Collects issues for one file, so parsers need not repeat the path everywhere."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.issues: list[ConfigIssue] = []

    def warn(self, line: int, message: str) -> None:
        self.issues.append(ConfigIssue(self.path, line, message, "warning"))

    def error(self, line: int, message: str) -> None:
        self.issues.append(ConfigIssue(self.path, line, message, "error"))
