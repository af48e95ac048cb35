"""Coverage-guided fuzzing (atheris) of the decoders, the config parsers and the provider's
MAD handler.

Every target of ``atheris_targets`` is fuzzed in its own child process, two at a time: a few
thousand inputs or one second each here, 10^5 inputs each under ``make soak``. A target
must finish without a crash and with coverage feedback (an uninstrumented run would fuzz
blind). The seeds themselves are checked in-process too, without atheris.
"""

from __future__ import annotations

import platform
import sys

import pytest

from ibacm.config.route_file import parse_route_file
from tests.conftest import not_applicable_if, require_file, require_module
from tests.reliability.atheris_fuzz import crash_excerpt, run_targets
from tests.reliability.atheris_targets import CAPTURES, TARGETS, captured
from tests.reliability.errors import logged_errors
from tests.reliability.live import SOAK, soak

RUNS = soak(3000, 100_000)
SECONDS = None if SOAK else 1.0
JOBS = 2

# Where the test extra installs atheris (its marker in pyproject.toml): elsewhere it has no build.
ATHERIS_HOST = (platform.machine(), sys.platform, platform.python_implementation()) == (
    "x86_64",
    "linux",
    "CPython",
)


def test_every_target_passes_its_own_seeds() -> None:
    with logged_errors() as errors:
        for name, entry in TARGETS.items():
            seeds = entry.seeds()
            assert seeds, f"{name} has no seeds"
            target = entry.make()
            for seed in seeds:
                target(seed)
    assert errors == []


def test_client_seeds_include_the_captures() -> None:
    require_file(CAPTURES)
    real = captured()
    assert real
    assert set(real) <= set(TARGETS["client_framer"].seeds())


@not_applicable_if(not ATHERIS_HOST, "atheris is built for x86_64 Linux CPython only")
@pytest.mark.timeout(3600 if SOAK else 300)
def test_atheris_finds_no_crash_in_any_target() -> None:
    require_module("atheris")  # pip install 'atheris>=2.3' (the test extra)
    outcomes = list(run_targets(list(TARGETS), RUNS, SECONDS, JOBS))
    assert [outcome.target for outcome in outcomes] == list(TARGETS)
    for outcome in outcomes:
        assert outcome.ok, f"{outcome.line()}\n{crash_excerpt(outcome)}"
        assert outcome.runs > 0 and outcome.coverage > 0, outcome.line()
        if SOAK:
            assert outcome.runs >= RUNS, outcome.line()
    # The MAD handler target runs the provider on what it receives (ACM MADs, SA answers),
    # far beyond the decoder it starts with (25 edges; the handler's seeds alone reach ~670).
    coverage = {outcome.target: outcome.coverage for outcome in outcomes}
    assert coverage["acmp_handler"] >= 20 * coverage["acm_mad"], coverage


def test_route_file_never_yields_a_path_to_lid_0() -> None:
    """Found by the route_file target: a header with base LID 0 put LID 0 in the LID table,
    so a ``0x0 : ...`` line became a preloaded path to the reserved LID."""
    text = 'Switch 0x8f10500100001, base LID 0, "s", port 0\n0x0000 : 1 : 4 : 16\n'
    dump, issues = parse_route_file(text, "route.data")
    assert 0 not in dump.lid_to_guid
    assert [path for section in dump.sections for path in section.paths] == []
    assert [(issue.line, issue.severity) for issue in issues] == [(1, "warning"), (2, "error")]
    TARGETS["route_file"].make()(text.encode())
