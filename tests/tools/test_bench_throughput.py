"""What make bench-throughput says about a point and about issue 28's targets, from figures
of the shape loadgen gives (the measuring itself is tested in test_bench_loadgen)."""

from __future__ import annotations

from typing import Any

from tests.bench import throughput


def figures(rps: float, **changes: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "clients": 16,
        "sent": 1000,
        "answered": 1000,
        "unanswered": 0,
        "lost_on_reset": 0,
        "never_answered": 0,
        "resets": 0,
        "errors": 0,
        "refused": 0,
        "rps": rps,
        "p50_us": 10.0,
        "p99_us": 20.0,
        "loadavg": 1.5,
        "server_cpu_us_per_request": 5.0,
        **changes,
    }
    found["outcome"] = throughput.outcome(found, died=False)
    found["answered_all"] = found["outcome"] == "answered all"
    return found


def test_outcome_says_what_the_server_did() -> None:
    assert throughput.outcome(figures(1.0), died=False) == "answered all"
    dead = figures(1.0, never_answered=3, unanswered=5, lost_on_reset=2, refused=40, resets=9)
    assert throughput.outcome(dead, died=True) == (
        "server died; 3 of 16 clients never answered; 7 of 1000 requests unanswered; "
        "40 connects refused"
    )
    hung_up = throughput.outcome(figures(1.0, resets=12, lost_on_reset=50), died=False)
    assert hung_up == "50 of 1000 requests unanswered; 12 disconnects"


def test_the_median_round_is_kept_with_every_rounds_outcome() -> None:
    rounds = [figures(3.0), figures(1.0, never_answered=1), figures(2.0)]
    chosen = throughput.median_run(rounds)
    assert chosen["rps"] == 2.0
    assert chosen["answered_all_rounds"] is False
    assert chosen["outcomes"][1] == "1 of 16 clients never answered"


def results(
    ours: dict[str, dict[str, Any]], others: dict[str, dict[str, dict[str, Any]]]
) -> dict[str, Any]:
    points = {"ibacm": ours, **others}
    return {
        "servers": list(points),
        "points": {
            name: {key: throughput.median_run([fig]) for key, fig in by_key.items()}
            for name, by_key in points.items()
        },
    }


def test_targets_are_met_or_not_with_their_figures() -> None:
    found = throughput.targets_of(
        results(
            {
                "oneshot_16": figures(2100.0),
                "oneshot_1": figures(500.0),
                "cached_1": figures(1.0, p50_us=11.0),
                "cached_1024": figures(1.0, p99_us=600_000.0),
                "cached_4096": figures(1.0, never_answered=2),
            },
            {
                "c_ibacm": {
                    "oneshot_16": figures(1000.0),
                    "oneshot_1": figures(1000.0),
                },
                "c_responder": {"cached_1": figures(1.0, p50_us=10.0)},
            },
        )
    )
    assert found["oneshot_16>=2.0x_c_ibacm"].startswith("met: ibacm 2100 conn/s = 2.1x")
    assert found["oneshot_1>=0.6x_c_ibacm"].startswith("NOT met: ibacm 500 conn/s = 0.5x")
    assert found["cached_1_p50<=1.2x_c_responder"].startswith("met: ibacm p50 11.0 us = 1.1x")
    assert found["cached_1024_every_request_answered_p99<=500ms"].startswith("NOT met")  # p99
    assert found["cached_4096_every_request_answered"].startswith(
        "NOT met: 2 of 16 clients never answered"
    )
    assert found["cached_64>=0.7x_c_ibacm"].startswith("not measured")
    assert found["pipeline_64_cpu<=2.0x_noop_loop"].startswith("not measured")


def test_the_table_has_a_row_per_point_and_says_who_did_not_answer() -> None:
    lines = throughput.table(
        results(
            {"cached_1": figures(100.0)},
            {"c_ibacm": {"cached_1": figures(50.0, never_answered=4)}},
        )
    )
    assert lines[0] == "| point | ibacm | c_ibacm |"
    assert len(lines) == 3 and lines[2].startswith("| cached_1 | 100 req/s")
    assert "4 of 16 clients never answered" in lines[2]
