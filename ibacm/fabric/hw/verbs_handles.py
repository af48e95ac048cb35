"""The C handles behind pyverbs objects, for the verbs calls pyverbs does not offer.

pyverbs (rdma-core 44 and later) covers devices, contexts, PDs, MRs, CQs, QPs, AHs and work
requests, but it has no ``ibv_attach_mcast``/``ibv_detach_mcast``, does not expose the file
descriptors of a completion channel or of a context's async events (so trio cannot wait on
them), and its ``AsyncEvent`` drops the port number of port events. Those four calls go to
libibverbs directly through ctypes, with the C pointers read out of the pyverbs objects:

* A pyverbs class deriving from ``PyverbsCM`` (``Context``, ``CompChannel``, ``QP``) keeps its
  C handle (``ibv_context *``, ``ibv_comp_channel *``, ``ibv_qp *``) as the first C field,
  right after the ``PyverbsCM`` part of the object, i.e. at ``PyverbsCM.__basicsize__`` bytes
  into the Python object (pyverbs' ``.pxd`` declarations; the tests check this layout on
  objects that need no device).
* Every pointer is validated against what pyverbs does expose before it is used: the
  context's ``cmd_fd`` and ``num_comp_vectors``, the channel's context, the QP's context,
  number and type. Validation reads go through ``/proc/self/mem``, so a layout mismatch
  raises ``VerbsHandleError`` instead of crashing the process.
* Struct offsets are those of ``<infiniband/verbs.h>`` (stable libibverbs ABI), checked
  against the installed header by the tests when a C compiler is present.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Any

from ibacm.fabric.api import FabricError
from ibacm.fabric.hw.cdll import load_interposable

LIBRARY = "libibverbs.so.1"
IBV_QPT_UD = 4

# struct ibv_context
CTX_CMD_FD = 264
CTX_ASYNC_FD = 268
CTX_NUM_COMP_VECTORS = 272
# struct ibv_comp_channel
CHANNEL_CONTEXT = 0
CHANNEL_FD = 8
# struct ibv_qp
QP_CONTEXT = 0
QP_NUM = 52
QP_TYPE = 60


class VerbsHandleError(FabricError):
    """A C handle could not be taken from a pyverbs object, or a direct verbs call failed."""


class _AsyncEvent(ctypes.Structure):
    """``struct ibv_async_event``: a union of element pointers/port number, then the type."""

    _fields_ = (("element", ctypes.c_uint64), ("event_type", ctypes.c_int))


@dataclass(frozen=True, slots=True)
class ContextHandle:
    pointer: int
    cmd_fd: int
    async_fd: int


@dataclass(frozen=True, slots=True)
class AsyncEventRecord:
    event_type: int
    element: int
    """The port number for port events; a C object pointer for CQ/QP/SRQ events."""


def _peek(address: int, size: int) -> bytes:
    """Read process memory without faulting: an unmapped address raises VerbsHandleError."""
    if address <= 0:
        raise VerbsHandleError(f"null or invalid pointer {address:#x}")
    fd = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        data = os.pread(fd, size, address)
    except OSError as exc:
        raise VerbsHandleError(f"pointer {address:#x} is not readable ({exc})") from exc
    finally:
        os.close(fd)
    if len(data) != size:
        raise VerbsHandleError(f"short read at {address:#x}")
    return data


def _peek_int(address: int, size: int = 4, *, signed: bool = True) -> int:
    return int.from_bytes(_peek(address, size), sys.byteorder, signed=signed)


class VerbsHandles:
    """Reads validated C handles out of pyverbs objects."""

    def __init__(self, pyverbs_cm_type: type) -> None:
        # Offset of the first C field of a direct PyverbsCM subclass.
        self._field_offset = int(pyverbs_cm_type.__basicsize__)

    def _first_field(self, obj: Any) -> int:
        if type(obj).__basicsize__ < self._field_offset + ctypes.sizeof(ctypes.c_void_p):
            raise VerbsHandleError(f"{type(obj).__name__} has no C handle at the expected place")
        pointer = ctypes.c_void_p.from_address(id(obj) + self._field_offset).value
        if not pointer:
            raise VerbsHandleError(f"{type(obj).__name__} is closed (null C handle)")
        return int(pointer)

    def context(self, ctx: Any) -> ContextHandle:
        pointer = self._first_field(ctx)
        cmd_fd = _peek_int(pointer + CTX_CMD_FD)
        comp_vectors = _peek_int(pointer + CTX_NUM_COMP_VECTORS)
        if cmd_fd != ctx.cmd_fd or comp_vectors != ctx.num_comp_vectors:
            raise VerbsHandleError(
                "pyverbs Context layout not recognised "
                f"(cmd_fd {cmd_fd} vs {ctx.cmd_fd}, comp vectors {comp_vectors} vs "
                f"{ctx.num_comp_vectors})"
            )
        return ContextHandle(pointer, cmd_fd, _peek_int(pointer + CTX_ASYNC_FD))

    def comp_channel_fd(self, channel: Any, context: ContextHandle) -> int:
        pointer = self._first_field(channel)
        owner = _peek_int(pointer + CHANNEL_CONTEXT, 8, signed=False)
        if owner != context.pointer:
            raise VerbsHandleError("pyverbs CompChannel layout not recognised (context differs)")
        fd = _peek_int(pointer + CHANNEL_FD)
        _require_event_fd(fd)
        return fd

    def qp(self, qp: Any, context: ContextHandle) -> int:
        pointer = self._first_field(qp)
        owner = _peek_int(pointer + QP_CONTEXT, 8, signed=False)
        qp_num = _peek_int(pointer + QP_NUM, signed=False)
        qp_type = _peek_int(pointer + QP_TYPE)
        if owner != context.pointer or qp_num != qp.qp_num or qp_type != IBV_QPT_UD:
            raise VerbsHandleError(
                f"pyverbs QP layout not recognised (qp_num {qp_num} vs {qp.qp_num}, type {qp_type})"
            )
        return pointer


def _require_event_fd(fd: int) -> None:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as exc:
        raise VerbsHandleError(f"completion channel fd {fd} is not open ({exc})") from exc
    # A kernel event channel, or the emulated HCA's connection (ibacm.fabric.emu).
    if "infinibandevent" not in target and not target.startswith("socket:"):
        raise VerbsHandleError(f"fd {fd} is {target}, not a verbs event channel")


class LibVerbs:
    """The libibverbs functions pyverbs lacks, called with handles from ``VerbsHandles``."""

    def __init__(self, library: str = LIBRARY) -> None:
        try:
            lib = load_interposable(library)
        except OSError as exc:
            raise VerbsHandleError(f"cannot load {library} ({exc})") from exc
        void_p = ctypes.c_void_p
        lib.ibv_get_async_event.argtypes = [void_p, ctypes.POINTER(_AsyncEvent)]
        lib.ibv_get_async_event.restype = ctypes.c_int
        lib.ibv_ack_async_event.argtypes = [ctypes.POINTER(_AsyncEvent)]
        lib.ibv_ack_async_event.restype = None
        for name in ("ibv_attach_mcast", "ibv_detach_mcast"):
            function = getattr(lib, name)
            function.argtypes = [void_p, ctypes.c_char_p, ctypes.c_uint16]
            function.restype = ctypes.c_int
        self._lib = lib

    def get_async_event(self, context: ContextHandle) -> AsyncEventRecord:
        """Read and acknowledge one async event (call when the async fd is readable)."""
        event = _AsyncEvent()
        if self._lib.ibv_get_async_event(context.pointer, ctypes.byref(event)) != 0:
            code = ctypes.get_errno()
            raise VerbsHandleError(f"ibv_get_async_event failed: {os.strerror(code)}")
        record = AsyncEventRecord(event.event_type, int(event.element))
        # Acknowledged at once: ibv_destroy_qp/cq wait until their events are acknowledged.
        self._lib.ibv_ack_async_event(ctypes.byref(event))
        return record

    def attach_mcast(self, qp_pointer: int, mgid: bytes, mlid: int) -> None:
        self._mcast("ibv_attach_mcast", qp_pointer, mgid, mlid)

    def detach_mcast(self, qp_pointer: int, mgid: bytes, mlid: int) -> None:
        self._mcast("ibv_detach_mcast", qp_pointer, mgid, mlid)

    def _mcast(self, name: str, qp_pointer: int, mgid: bytes, mlid: int) -> None:
        if len(mgid) != 16:
            raise VerbsHandleError(f"{name}: an MGID is 16 bytes, got {len(mgid)}")
        rc = getattr(self._lib, name)(qp_pointer, mgid, mlid)
        if rc != 0:
            raise VerbsHandleError(
                f"{name}(mgid {mgid.hex()}, mlid {mlid:#06x}) failed: {os.strerror(abs(rc))}"
            )
