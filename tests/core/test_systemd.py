"""The socket-activation environment (the full --systemd run is in test_cli)."""

from __future__ import annotations

import pytest

from ibacm.core.systemd import InheritedSockets, SocketActivationError, take_listen_fds


def test_no_activation() -> None:
    env = {"PATH": "/bin"}
    assert take_listen_fds(env, pid=1) == InheritedSockets()


def test_activation_meant_for_another_process() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1"}
    assert take_listen_fds(env, pid=2).stream is None
    assert "LISTEN_FDS" not in env  # not inherited further


@pytest.mark.parametrize(
    ("fds", "message"),
    [("3", "at most one listening stream socket"), ("x", "not numbers"), ("-1", "negative")],
)
def test_activation_errors(fds: str, message: str) -> None:
    with pytest.raises(SocketActivationError, match=message):
        take_listen_fds({"LISTEN_PID": "7", "LISTEN_FDS": fds}, pid=7)
