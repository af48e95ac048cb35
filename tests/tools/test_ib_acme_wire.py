"""Our ib_acme sends the exact bytes Debian's ib_acme sends (captures/client-requests).

Each capture was recorded from the real tool with the command in the capture README; ours is
run with the same arguments against the fake daemon, and the request it sends must be the
captured one, byte for byte.
"""

from __future__ import annotations

import pytest

from ibacm.wire.client import AcmMessage, EpFlag
from tests.conftest import CAPTURES, require_file
from tests.tools.conftest import run_ours
from tests.tools.fake_acm import FakeAcm


def capture(name: str) -> bytes:
    return require_file(CAPTURES / f"{name}.bin").read_bytes()


@pytest.mark.trio
@pytest.mark.parametrize(
    ("args", "captures"),
    [
        (["-P"], ["P_001"]),
        (["-P", "all"], ["P_all_001", "P_all_002"]),
        (["-P", "s", "-s", "192.168.100.1"], ["P_s_001"]),
        (["-e"], ["e_001"]),
        (["-e", "1"], ["v59_004"]),
        (["-d", "1.2.3.4"], ["d_ip_001"]),
        (["-d", "1.2.3.4", "-c"], ["d_ip_c_001"]),
        (["-d", "fe80::5"], ["d_ip6_001"]),
        (["-s", "10.0.0.1", "-d", "1.2.3.4", "-v"], ["d_ip_src_v_001"]),
        (["-f", "l", "-s", "1", "-d", "5", "-v"], ["d_lid_v_001"]),
        (["-f", "g", "-s", "fe80::1", "-d", "fe80::2"], ["d_gid_001"]),
        (["-f", "n", "-s", "node1", "-d", "node5"], ["d_name_001"]),
    ],
)
async def test_requests_are_byte_identical(
    fake: FakeAcm, args: list[str], captures: list[str]
) -> None:
    await run_ours("-S", str(fake.path), *args)
    assert fake.requests[: len(captures)] == [capture(name) for name in captures]


@pytest.mark.trio
async def test_sa_verification_request_carries_the_answered_path(fake: FakeAcm) -> None:
    await run_ours("-S", str(fake.path), "-f", "l", "-s", "1", "-d", "2", "-v")
    resolve, verify = fake.requests
    answered = AcmMessage.decode(fake.reply(resolve)).entries[0].path()
    entry = AcmMessage.decode(verify).entries[0]
    assert (entry.flags, entry.path()) == (EpFlag.QUERY_SA, answered)
    # Header, flags, type and reserved bytes are those of the real tool's verify request.
    assert verify[:24] == capture("d_lid_v_002")[:24]


@pytest.mark.trio
async def test_endpoint_walk_asks_each_port_like_c(fake: FakeAcm) -> None:
    await run_ours("-S", str(fake.path), "-e")
    asked = [(request[3], request[4]) for request in fake.requests]
    # Index 1 on ports 1-2 (the reply says 2 ports), index 2 likewise, then index 3 walks
    # all 255 ports before giving up, exactly as the C tool does.
    assert asked[:4] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert asked[4:] == [(3, port) for port in range(1, 256)]
