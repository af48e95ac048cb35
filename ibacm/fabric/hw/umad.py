"""libibumad through ctypes: the kernel umad interface for SA MADs.

libibumad (``libibumad.so.3``, rdma-core) wraps ``/dev/infiniband/umadN`` (mad-protocol.md
§9.8). Going through the library rather than the raw device ABI keeps one code path for a
real kernel and for ibsim's ``libumad2sim.so`` preload, which replaces the device files with
sockets to the fabric simulator (real-peers.md §3).

Facts this binding relies on:

* The size of the umad header (``umad_size()``) is only final once a port is open (the
  simulator reports 56 before, 64 after), so buffers are sized per call and the header is
  filled with the library's own setters (``umad_set_addr``/``umad_set_pkey``).
* ``umad_recv`` with a timeout returns ``-ETIMEDOUT`` when nothing arrived, and ``-ENOSPC``
  (with the needed length) when a kernel-reassembled RMPP reply is longer than the buffer;
  the packet then stays queued and is read again with a larger buffer.
* A send that the kernel gave up on comes back through ``umad_recv`` with a non-zero status
  (``ETIMEDOUT``) and the MAD as sent, so it can be matched to its request by TID.
* A kernel port's fd (``umad_get_fd``) polls readable when a packet is queued, and so does
  the emulated HCA's (a socket): the SA agent waits for it in trio and reads with a timeout
  of 0, which returns ``-ETIMEDOUT`` or ``-EAGAIN`` when nothing is queued. Under ibsim's
  preload the "fd" is a number of its own (1024 on), not a descriptor: receiving is then a
  blocking call that the SA agent runs in a worker thread (``poll_fd`` says which).

Every call here blocks at most for the timeout it is given; nothing here knows about trio.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ibacm.fabric.api import FabricError, PortState
from ibacm.fabric.hw.cdll import load_interposable

LIBRARY = "libibumad.so.3"
CA_NAME_LEN = 20
MAX_CAS = 32
MAX_PORTS = 10
RECV_CAPACITY = 256
"""Initial receive buffer for the MAD part; grown on ENOSPC (RMPP replies)."""
MAX_RECV = 1 << 20
"""Largest reassembled reply accepted (a GetTable of ~16000 PathRecords)."""


class UmadError(FabricError):
    """A libibumad call failed."""


class _PortStruct(ctypes.Structure):
    """``umad_port_t`` (umad.h); the ``__be64`` GUIDs are read as native integers (for the
    alignment) and converted by ``_be``."""

    _fields_ = (
        ("ca_name", ctypes.c_char * CA_NAME_LEN),
        ("portnum", ctypes.c_int),
        ("base_lid", ctypes.c_uint),
        ("lmc", ctypes.c_uint),
        ("sm_lid", ctypes.c_uint),
        ("sm_sl", ctypes.c_uint),
        ("state", ctypes.c_uint),
        ("phys_state", ctypes.c_uint),
        ("rate", ctypes.c_uint),
        ("capmask", ctypes.c_uint32),
        ("gid_prefix", ctypes.c_uint64),
        ("port_guid", ctypes.c_uint64),
        ("pkeys_size", ctypes.c_uint),
        ("pkeys", ctypes.POINTER(ctypes.c_uint16)),
        ("link_layer", ctypes.c_char * CA_NAME_LEN),
    )


class _CaStruct(ctypes.Structure):
    """``umad_ca_t`` (umad.h)."""

    _fields_ = (
        ("ca_name", ctypes.c_char * CA_NAME_LEN),
        ("node_type", ctypes.c_uint),
        ("numports", ctypes.c_int),
        ("fw_ver", ctypes.c_char * 20),
        ("ca_type", ctypes.c_char * 40),
        ("hw_ver", ctypes.c_char * 20),
        ("node_guid", ctypes.c_uint64),
        ("system_guid", ctypes.c_uint64),
        ("ports", ctypes.POINTER(_PortStruct) * MAX_PORTS),
    )


@dataclass(frozen=True, slots=True)
class UmadPortInfo:
    """What libibumad reads from sysfs about one port."""

    ca_name: str
    port_num: int
    base_lid: int
    lmc: int
    sm_lid: int
    sm_sl: int
    state: PortState
    phys_state: int
    rate: int
    """Gb/s as sysfs reports it (e.g. 10 for 4x SDR)."""
    gid_prefix: int
    port_guid: int
    pkeys: tuple[int, ...]
    link_layer: str

    @property
    def gid(self) -> bytes:
        return self.gid_prefix.to_bytes(8, "big") + self.port_guid.to_bytes(8, "big")


@dataclass(frozen=True, slots=True)
class UmadCaInfo:
    name: str
    node_type: int
    node_guid: int
    numports: int
    ports: tuple[UmadPortInfo, ...]
    """The ports libibumad reports, in port-number order."""


@dataclass(frozen=True, slots=True)
class UmadPacket:
    """One read from the umad port: a received MAD or a returned (failed) send."""

    agent_id: int
    status: int
    """0 for a received MAD; an errno (ETIMEDOUT...) for a send the kernel gave up on."""
    mad: bytes


@dataclass(frozen=True, slots=True)
class UmadSendAddress:
    """``ib_mad_addr`` fields ibacm sets for an SA MAD (no GRH)."""

    dlid: int
    dqpn: int
    sl: int
    qkey: int
    pkey_index: int


class UmadApi(Protocol):
    """What the backend needs from libibumad (a fake implements it in unit tests)."""

    def ca_names(self) -> list[str]: ...

    def ca(self, name: str) -> UmadCaInfo: ...

    def port(self, ca_name: str, port_num: int) -> UmadPortInfo: ...

    def open_port(self, ca_name: str, port_num: int) -> int: ...

    def close_port(self, portid: int) -> None: ...

    def register(
        self,
        portid: int,
        mgmt_class: int,
        class_version: int,
        rmpp_version: int,
        methods: Sequence[int] = (),
    ) -> int: ...

    def unregister(self, portid: int, agent_id: int) -> None: ...

    def send(
        self,
        portid: int,
        agent_id: int,
        mad: bytes,
        addr: UmadSendAddress,
        *,
        timeout_ms: int,
        retries: int,
    ) -> None: ...

    def recv(self, portid: int, timeout_ms: int) -> UmadPacket | None: ...

    def poll_fd(self, portid: int) -> int | None:
        """A descriptor that polls readable when ``recv`` has a packet, or None when there
        is none to poll (then ``recv`` blocks in a worker thread)."""
        ...


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def _be(value: int) -> int:
    """A ``__be64`` field read as a native integer, back to its big-endian meaning."""
    return int.from_bytes(value.to_bytes(8, sys.byteorder), "big")


def _port_info(port: _PortStruct) -> UmadPortInfo:
    pkeys = tuple(port.pkeys[index] for index in range(port.pkeys_size)) if port.pkeys else ()
    try:
        state = PortState(port.state)
    except ValueError:
        state = PortState.NOP
    return UmadPortInfo(
        ca_name=_text(port.ca_name),
        port_num=port.portnum,
        base_lid=port.base_lid,
        lmc=port.lmc,
        sm_lid=port.sm_lid,
        sm_sl=port.sm_sl,
        state=state,
        phys_state=port.phys_state,
        rate=port.rate,
        gid_prefix=_be(port.gid_prefix),
        port_guid=_be(port.port_guid),
        pkeys=pkeys,
        link_layer=_text(port.link_layer),
    )


class LibUmad:
    """The libibumad functions ibacm uses, with errors turned into ``UmadError``."""

    def __init__(self, library: str = LIBRARY) -> None:
        try:
            self._lib = load_interposable(library)
        except OSError as exc:
            hint = "install libibumad3 (rdma-core)"
            raise UmadError(f"cannot load {library} ({exc}): {hint}") from exc
        self._declare()
        rc = self._lib.umad_init()
        if rc < 0:
            raise UmadError(f"umad_init failed: {errno.errorcode.get(-rc, rc)}")

    def _declare(self) -> None:
        lib = self._lib
        char_p, c_int, c_void_p = ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p
        signatures: dict[str, tuple[type | None, list[type]]] = {
            "umad_init": (c_int, []),
            "umad_get_cas_names": (c_int, [c_void_p, c_int]),
            "umad_get_ca": (c_int, [char_p, ctypes.POINTER(_CaStruct)]),
            "umad_release_ca": (c_int, [ctypes.POINTER(_CaStruct)]),
            "umad_get_port": (c_int, [char_p, c_int, ctypes.POINTER(_PortStruct)]),
            "umad_release_port": (c_int, [ctypes.POINTER(_PortStruct)]),
            "umad_open_port": (c_int, [char_p, c_int]),
            "umad_close_port": (c_int, [c_int]),
            "umad_register": (c_int, [c_int, c_int, c_int, ctypes.c_uint8, c_void_p]),
            "umad_unregister": (c_int, [c_int, c_int]),
            "umad_size": (ctypes.c_size_t, []),
            "umad_get_mad": (c_void_p, [c_void_p]),
            "umad_status": (c_int, [c_void_p]),
            "umad_set_addr": (c_int, [c_void_p, c_int, c_int, c_int, c_int]),
            "umad_set_pkey": (c_int, [c_void_p, c_int]),
            "umad_send": (c_int, [c_int, c_int, c_void_p, c_int, c_int, c_int]),
            "umad_recv": (c_int, [c_int, c_void_p, ctypes.POINTER(c_int), c_int]),
            "umad_get_fd": (c_int, [c_int]),
        }
        for name, (restype, argtypes) in signatures.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes

    # -- discovery ---------------------------------------------------------------------------
    def ca_names(self) -> list[str]:
        names = (ctypes.c_char * CA_NAME_LEN * MAX_CAS)()
        count = self._lib.umad_get_cas_names(names, MAX_CAS)
        if count < 0:
            raise UmadError(f"umad_get_cas_names failed: {self._err(count)}")
        return [_text(bytes(names[index])) for index in range(count)]

    def ca(self, name: str) -> UmadCaInfo:
        ca = _CaStruct()
        rc = self._lib.umad_get_ca(name.encode(), ctypes.byref(ca))
        if rc < 0:
            raise UmadError(f"umad_get_ca({name}) failed: {self._err(rc)}")
        try:
            ports = tuple(_port_info(pointer.contents) for pointer in ca.ports if pointer)
            return UmadCaInfo(
                name=_text(ca.ca_name),
                node_type=ca.node_type,
                node_guid=_be(ca.node_guid),
                numports=ca.numports,
                ports=ports,
            )
        finally:
            self._lib.umad_release_ca(ctypes.byref(ca))

    def port(self, ca_name: str, port_num: int) -> UmadPortInfo:
        port = _PortStruct()
        rc = self._lib.umad_get_port(ca_name.encode(), port_num, ctypes.byref(port))
        if rc < 0:
            raise UmadError(f"umad_get_port({ca_name}, {port_num}) failed: {self._err(rc)}")
        try:
            return _port_info(port)
        finally:
            self._lib.umad_release_port(ctypes.byref(port))

    # -- agents and MADs ---------------------------------------------------------------------
    def open_port(self, ca_name: str, port_num: int) -> int:
        portid = self._lib.umad_open_port(ca_name.encode(), port_num)
        if portid < 0:
            raise UmadError(f"umad_open_port({ca_name}, {port_num}) failed: {self._err(portid)}")
        return int(portid)

    def close_port(self, portid: int) -> None:
        self._lib.umad_close_port(portid)

    def register(
        self,
        portid: int,
        mgmt_class: int,
        class_version: int,
        rmpp_version: int,
        methods: Sequence[int] = (),
    ) -> int:
        # Solicited responses are matched by the kernel on the TID; ``methods`` are the
        # unsolicited ones this agent takes (e.g. SubnAdmReport), as a 128-bit method mask.
        mask = None
        if methods:
            mask = (ctypes.c_ulong * (16 // ctypes.sizeof(ctypes.c_ulong)))()
            bits = ctypes.sizeof(ctypes.c_ulong) * 8
            for method in methods:
                mask[method // bits] |= 1 << (method % bits)
        agent = self._lib.umad_register(portid, mgmt_class, class_version, rmpp_version, mask)
        if agent < 0:
            raise UmadError(
                f"umad_register(class {mgmt_class:#04x} v{class_version}) failed: "
                f"{self._err(agent)}"
            )
        return int(agent)

    def unregister(self, portid: int, agent_id: int) -> None:
        self._lib.umad_unregister(portid, agent_id)

    def send(
        self,
        portid: int,
        agent_id: int,
        mad: bytes,
        addr: UmadSendAddress,
        *,
        timeout_ms: int,
        retries: int,
    ) -> None:
        header = self._lib.umad_size()
        buffer = ctypes.create_string_buffer(header + len(mad))
        ctypes.memmove(self._lib.umad_get_mad(buffer), mad, len(mad))
        self._lib.umad_set_addr(buffer, addr.dlid, addr.dqpn, addr.sl, addr.qkey)
        self._lib.umad_set_pkey(buffer, addr.pkey_index)
        rc = self._lib.umad_send(portid, agent_id, buffer, len(mad), timeout_ms, retries)
        if rc < 0:
            raise UmadError(f"umad_send failed: {self._err(rc)}")

    def recv(self, portid: int, timeout_ms: int) -> UmadPacket | None:
        """The next packet, or None when nothing arrived within ``timeout_ms``."""
        capacity = RECV_CAPACITY
        wait = timeout_ms
        while True:
            header = self._lib.umad_size()
            buffer = ctypes.create_string_buffer(header + capacity)
            length = ctypes.c_int(capacity)
            rc = self._lib.umad_recv(portid, buffer, ctypes.byref(length), wait)
            if rc >= 0:
                start = self._lib.umad_get_mad(buffer) - ctypes.addressof(buffer)
                return UmadPacket(
                    agent_id=int(rc),
                    status=int(self._lib.umad_status(buffer)),
                    mad=buffer.raw[start : start + length.value],
                )
            if rc in (-errno.ETIMEDOUT, -errno.EAGAIN):
                return None
            if rc == -errno.ENOSPC and capacity < length.value <= MAX_RECV:
                capacity, wait = length.value, 0  # the packet is still queued: read it now
                continue
            raise UmadError(f"umad_recv failed: {self._err(rc)}")

    def poll_fd(self, portid: int) -> int | None:
        if "umad2sim" in os.environ.get("LD_PRELOAD", ""):
            return None  # ibsim's fake descriptors: a real one may have the same number
        fd = int(self._lib.umad_get_fd(portid))
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return None
        return fd if stat.S_ISCHR(mode) or stat.S_ISSOCK(mode) else None

    @staticmethod
    def _err(rc: int) -> str:
        code = -rc if rc < 0 else ctypes.get_errno()
        return f"{errno.errorcode.get(code, str(code))} ({code})"
