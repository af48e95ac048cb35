"""The simulated SA's entry point (ibacm.fabric.sim.sa.SubnetAdministrator) on its own: what
gets no answer, the generic errors, BUSY, and what it counts, before any attribute's module."""

from __future__ import annotations

from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.routing import Router
from ibacm.fabric.sim.sa import SubnetAdministrator
from ibacm.fabric.sim.topo_file import generate
from ibacm.wire.mad import MAD_SIZE, MadStatus, Method, SaAttr, SaMad, build_path_get, sa_mad
from ibacm.wire.path_record import PathRecord


def setup() -> tuple[SubnetAdministrator, Directory]:
    topology = generate(2)
    directory = Directory(topology, Router(topology))
    return SubnetAdministrator(directory), directory


def test_garbage_and_responses_get_no_answer() -> None:
    sa, directory = setup()
    port = directory.port("node1", "mlx5_0", 1)
    good = build_path_get(1, PathRecord(slid=port.lid, dlid=port.lid, numb_path=1))
    assert sa.handle(port, good[:-1]) == []  # not a MAD
    response = bytearray(good)
    response[3] |= Method.RESP
    assert sa.handle(port, bytes(response)) == []
    other_class = bytearray(good)
    other_class[1] = 0x2C  # an ACM MAD sent to the SA
    assert sa.handle(port, bytes(other_class)) == []
    assert sum(sa.records_sent.values()) == 0


def test_unknown_attribute_bad_version_and_busy_are_answered_with_the_request_echoed() -> None:
    sa, directory = setup()
    port = directory.port("node1", "mlx5_0", 1)
    unknown = sa_mad(Method.GET, 0x0099, 5, 0, b"\x01" * 8)
    [answer] = sa.handle(port, unknown)
    decoded = SaMad.decode(answer)
    assert decoded.mad.status & 0xFF == MadStatus.METHOD_ATTR_UNSUPPORTED
    assert decoded.mad.method == Method.GET_RESP and decoded.mad.tid == 5
    assert decoded.data[:8] == b"\x01" * 8
    old = bytearray(build_path_get(6, PathRecord(slid=port.lid, dlid=port.lid, numb_path=1)))
    old[2] = 1  # class version 1
    [answer] = sa.handle(port, bytes(old))
    assert SaMad.decode(answer).mad.status & 0xFF == MadStatus.BAD_VERSION
    [answer] = sa.busy(unknown)
    assert SaMad.decode(answer).mad.status & 0xFF == MadStatus.BUSY
    assert len(answer) == MAD_SIZE


def test_a_path_answered_is_counted_by_attribute() -> None:
    sa, directory = setup()
    one, two = (directory.port(f"node{i}", "mlx5_0", 1) for i in (1, 2))
    [answer] = sa.handle(one, build_path_get(9, PathRecord(slid=one.lid, dlid=two.lid)))
    decoded = SaMad.decode(answer)
    assert decoded.mad.status == 0
    assert PathRecord.decode(decoded.data[:64]).dlid == two.lid
    assert sa.records_sent[SaAttr.PATH_RECORD] == 1
