"""The dashboard's model: snapshots and events folded into rows, rates and log lines."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ibacm.wire.admin import EventMessage
from ibacm.wire.counters import Counter
from tui.model import DashboardModel, format_age, log_record
from tui.tables import natural_key

EP = "mlx5_0/1/0xffff"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def snapshot(**endpoint: Any) -> dict[str, Any]:
    return {
        "daemon": {"node": "node1", "log_level": 1},
        "counters": [0, 10, 0, 1, 0, 1, 8],
        "ports": [{"id": "mlx5_0/1", "state": "ACTIVE", "lid": 2}],
        "endpoints": [
            {
                "id": EP,
                "pkey": 0xFFFF,
                "state": "ready",
                "provider": "ibacmp",
                "addresses": [{"type": "ip", "address": "10.0.0.1/16"}, {"address": "node1"}],
                "groups": [
                    {"mgid": "ff15::", "mlid": 0xC001, "rate": 3, "mtu": 4, "state": "joined"}
                ],
                "counters": [0, 10, 0, 1, 0, 1, 8],
                **endpoint,
            }
        ],
    }


def event(kind: str, ts: float = 0.0, **data: Any) -> EventMessage:
    return EventMessage(kind, data, ts)


def test_snapshot_becomes_rows() -> None:
    model = DashboardModel(clock=Clock())
    model.apply_snapshot(
        snapshot(
            cache=[
                {
                    "dest": "10.0.0.3",
                    "type": "ip",
                    "state": "READY",
                    "age": 62.5,
                    "hits": 4,
                    "dlid": 3,
                }
            ]
        )
    )
    assert model.endpoint_rows() == {
        EP: (EP, "0xffff", "ready", "ibacmp", "10.0.0.1/16, node1", "1", "1", "10", "80.0%")
    }
    assert model.group_rows() == {
        f"{EP}|ff15::": (EP, "ff15::", "0xc001", "10 Gb/s", "2048", "joined")
    }
    assert model.port_rows() == {"mlx5_0/1": ("mlx5_0/1", "ACTIVE", "2", "-", "-", "-", "-")}
    assert model.cache_rows() == {
        f"{EP}|10.0.0.3": (EP, "10.0.0.3", "ip", "READY", "1m02s", "4", "3")
    }
    assert model.counter_rows()["global"] == ("global", "0", "10", "0", "1", "0", "1", "8", "80.0%")


def test_provider_variants_are_understood() -> None:
    # ibacmp reports "entries" with "address" and numeric ACM address types.
    model = DashboardModel(clock=Clock())
    model.apply_snapshot(
        snapshot(
            entries=[
                {"address": "node2", "type": 1, "state": "READY", "dlid": 3},
                {"address": "fd00::2", "type": 3, "state": "INIT"},
            ]
        )
    )
    rows = model.cache_rows()
    assert rows[f"{EP}|node2"][1:4] == ("node2", "name", "READY")
    assert rows[f"{EP}|fd00::2"][2] == "ip6"
    assert rows[f"{EP}|node2"][4:6] == ("-", "-")  # no age, no hits reported


def test_ages_move_with_the_clock() -> None:
    clock = Clock()
    model = DashboardModel(clock=clock)
    model.apply_snapshot(snapshot(cache=[{"dest": "x", "age": 5}]))
    clock.now += 3600
    assert model.cache_rows()[f"{EP}|x"][4] == "1h00m"
    # An update without an age keeps the known resolution time.
    model.apply_event(event("cache", endpoint=EP, dest="x", state="READY", hits=2))
    assert model.cache_rows()[f"{EP}|x"][4:6] == ("1h00m", "2")


def test_cache_and_group_events_upsert_and_remove() -> None:
    model = DashboardModel(clock=Clock())
    model.apply_snapshot(snapshot())
    model.dirty.cache = model.dirty.groups = False
    model.apply_event(event("cache", endpoint=EP, dest="node3", state="QUERY_ADDR"))
    assert model.dirty.cache and f"{EP}|node3" in model.cache_rows()
    model.apply_event(event("cache", endpoint=EP, dest="node3", removed=True))
    assert model.cache_rows() == {}
    model.apply_event(event("acmp.group", endpoint=EP, mgid="ff15::", mlid=1, state="failed"))
    assert model.group_rows()[f"{EP}|ff15::"][2:] == ("0x0001", "-", "-", "failed")
    model.apply_event(event("group", endpoint=EP, mgid="ff15::", rate=99, mtu="big"))
    assert model.group_rows()[f"{EP}|ff15::"][3:5] == ("99", "big")  # unknown enums as given
    model.apply_event(event("port", id="mlx5_0/1", mtu=5, width=2, speed=32, state="ACTIVE"))
    assert model.port_rows()["mlx5_0/1"][5:] == ("4096", "100 Gb/s")
    assert model.dirty.groups


def test_endpoint_events() -> None:
    model = DashboardModel(clock=Clock())
    model.apply_snapshot(snapshot(cache=[{"dest": "x"}]))
    model.apply_event(event("acmp.endpoint", endpoint=EP, state="init"))
    assert model.endpoint_rows()[EP][2] == "init"
    model.apply_event(event("endpoint", id="mlx5_1/1/0x8001", state="up", pkey=0x8001))
    assert model.endpoint_rows()["mlx5_1/1/0x8001"][1] == "0x8001"
    model.apply_event(event("endpoint", id=EP, state="removed"))
    assert EP not in model.endpoint_rows()
    assert model.cache_rows() == {} and model.group_rows() == {}


def test_stats_give_rates_and_hit_rates() -> None:
    model = DashboardModel(clock=Clock())
    model.apply_snapshot(snapshot())
    model.apply_event(event("stats", 10.0, counters=[0, 100, 0, 0, 0, 0, 50]))
    assert list(model.resolves_per_second) == []  # a first sample is only a baseline
    model.apply_event(event("stats", 12.0, counters=[0, 140, 0, 0, 0, 0, 80]))
    model.apply_event(event("stats", 13.0, counters=[0, 140, 0, 0, 0, 0, 80]))  # idle second
    assert list(model.resolves_per_second) == [20.0, 0.0]
    assert list(model.hit_rates) == [0.75, 0.75]
    summary = model.summary()
    assert summary["route_hit_rate"] == "57.1%"
    assert summary["resolves_per_second"] == "0.0/s"
    # A restarted daemon (counters went down) starts a new baseline instead of a negative rate.
    model.apply_event(event("stats", 14.0, counters=[0, 3, 0, 0, 0, 0, 1]))
    assert len(model.resolves_per_second) == 2
    model.apply_event(
        event("stats", 15.0, counters={"resolve": 13, "route_cache": 11}, endpoints={EP: [0, 13]})
    )
    assert model.resolves_per_second[-1] == 10.0
    assert model.endpoint_rows()[EP][7] == "13"


def test_dropped_marker_asks_for_a_snapshot() -> None:
    model = DashboardModel(clock=Clock())
    model.apply_snapshot(snapshot())
    model.apply_event(event("dropped", count=7))
    assert model.needs_snapshot and model.dropped_events == 7
    assert "7 events dropped" in model.logs[-1].text
    model.apply_snapshot(snapshot())
    assert not model.needs_snapshot


def test_log_records_and_level_filter() -> None:
    record = log_record(
        {
            "event": "resolved",
            "level": "warning",
            "logger": "ibacm.provider.acmp",
            "timestamp": "2026-01-02T03:04:05.678",
            "dest": "node2",
        }
    )
    assert record.text == "03:04:05.678 WARNING ibacm.provider.acmp: resolved dest=node2"
    # The daemon's stamps carry their UTC offset (ISO 8601); the line shows the time of day.
    offset = log_record({"event": "x", "timestamp": "2026-01-02T03:04:05.678912+05:30"})
    assert offset.text == "03:04:05.678 INFO    x"
    assert log_record({"event": "x", "timestamp": "soon"}).text == "soon INFO    x"
    model = DashboardModel(clock=Clock())
    for level in ("debug", "info", "warning", "error", "critical", "strange"):
        model.apply_event(event("log", event=level, level=level))
    assert [r.level for r in model.filtered_logs("warning")] == ["warning", "error", "critical"]
    assert len(model.filtered_logs("info")) == 5  # unknown levels count as info
    assert len(model.take_new_logs()) == 6 and model.take_new_logs() == []


def test_cache_filter_matches_any_column() -> None:
    model = DashboardModel(clock=Clock())
    model.apply_snapshot(
        snapshot(
            cache=[
                {"dest": "node2", "state": "READY"},
                {"dest": "10.0.0.9", "state": "QUERY_ROUTE"},
            ]
        )
    )
    assert list(model.cache_rows("route")) == [f"{EP}|10.0.0.9"]
    assert len(model.cache_rows("MLX5")) == 2
    assert model.cache_rows("nothing") == {}


def test_garbage_in_a_snapshot_is_ignored() -> None:
    model = DashboardModel(clock=Clock())
    model.apply_snapshot(
        {
            "daemon": "x",
            "endpoints": [
                None,
                3,
                {"no": "id"},
                {"id": EP, "cache": [7], "groups": 5, "addresses": "10.0.0.1"},
            ],
            "counters": "many",
            "ports": [1],
        }
    )
    assert list(model.endpoint_rows()) == [EP]
    assert model.counters == [0] * len(Counter)


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "-"), (-3, "0s"), (59.9, "59s"), (61, "1m01s"), (7322, "2h02m")]
)
def test_format_age(seconds: float | None, text: str) -> None:
    assert format_age(seconds) == text


def test_natural_sort_key() -> None:
    cells = ["10", "9", "1m02s", "59s", "75.0%", "8.5%", "0x0010", "0x0002", "node2", "-"]
    assert sorted(["10", "9", "100"], key=natural_key) == ["9", "10", "100"]
    assert sorted(["1m02s", "59s", "1h00m"], key=natural_key) == ["59s", "1m02s", "1h00m"]
    assert sorted(["75.0%", "8.5%"], key=natural_key) == ["8.5%", "75.0%"]
    assert sorted(["0x0010", "0x0002"], key=natural_key) == ["0x0002", "0x0010"]
    assert sorted(cells, key=natural_key)[-2:] == ["-", "node2"]  # text after numbers


def test_rates_start_over_with_another_daemon_only() -> None:
    model = DashboardModel(clock=Clock())
    first = snapshot()
    first["daemon"].update(pid=100, started=1000.0)
    model.apply_snapshot(first)
    model.apply_event(event("stats", 10.0, counters=[0, 100, 0, 0, 0, 0, 50]))
    model.apply_event(event("stats", 11.0, counters=[0, 140, 0, 0, 0, 0, 80]))
    assert list(model.resolves_per_second) == [40.0]
    model.apply_snapshot(first)  # a resync (or a reconnection) to the same daemon keeps them
    model.apply_event(event("stats", 12.0, counters=[0, 150, 0, 0, 0, 0, 90]))
    assert list(model.resolves_per_second) == [40.0, 10.0]
    # A restarted daemon: its first sample is a new baseline, even with counters that already
    # passed the old ones (no "counters went down" to notice).
    second = snapshot()
    second["daemon"].update(pid=200, started=2000.0)
    model.apply_snapshot(second)
    assert list(model.resolves_per_second) == [] and list(model.hit_rates) == []
    assert model.summary()["resolves_per_second"] == "-"
    assert model.summary()["recent_hit_rate"] == "-"
    model.apply_event(event("stats", 13.0, counters=[0, 500, 0, 0, 0, 0, 0]))
    assert list(model.resolves_per_second) == []
    model.apply_event(event("stats", 14.0, counters=[0, 503, 0, 0, 0, 0, 3]))
    assert list(model.resolves_per_second) == [3.0] and list(model.hit_rates) == [1.0]


def test_the_last_update_is_the_last_word_from_the_daemon() -> None:
    clock = Clock()
    wall = 1_790_000_000.0
    model = DashboardModel(clock=clock, wall_clock=lambda: wall)
    assert model.stale_note() == "not connected: no data from the daemon yet"
    model.apply_snapshot(snapshot(cache=[{"dest": "x", "age": 5}]))
    clock.now += 30
    wall += 30
    model.apply_event(event("stats", 1.0, counters=[0, 1]))
    clock.now += 100
    wall += 100
    model.add_local_log("warning", "disconnected")  # the dashboard's own line: no news
    assert model.updated_at == 130.0
    stamp = time.strftime("%H:%M:%S", time.localtime(1_790_000_030.0))
    assert model.stale_note() == (
        f"STALE: disconnected; last update at {stamp} (1m40s ago), values as they were then"
    )
    assert "ibacm-tui: disconnected" in model.logs[-1].text
    # Ages as of the last update stand still; by the clock they move on.
    assert model.cache_rows(now=model.updated_at)[f"{EP}|x"][4] == "35s"
    assert model.cache_rows()[f"{EP}|x"][4] == "2m15s"
