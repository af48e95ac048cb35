"""``acm_prov.h`` (version 1) as ctypes: the structures a C provider reads and its entry points.

Layouts are those of rdma-core's installed header; a test compiles a program against it and
compares every size and offset.
"""

from __future__ import annotations

import ctypes
from ctypes import CFUNCTYPE, POINTER, c_char_p, c_int, c_uint8, c_uint16, c_uint64, c_void_p

ACM_PROV_VERSION = 1
MSG_SIZE = 592
"""``sizeof(struct acm_msg)``."""


class AcmDevice(ctypes.Structure):
    _fields_ = (("verbs", c_void_p), ("dev_guid", c_uint64))


class AcmPort(ctypes.Structure):
    _fields_ = (("dev", POINTER(AcmDevice)), ("port_num", c_uint8))


class AcmEndpoint(ctypes.Structure):
    _fields_ = (("port", POINTER(AcmPort)), ("pkey", c_uint16))


class AcmAddress(ctypes.Structure):
    _fields_ = (
        ("endpoint", POINTER(AcmEndpoint)),
        ("info", c_uint8 * 64),
        ("id_string", c_char_p),
        ("type", c_uint16),
    )


OPEN_DEVICE = CFUNCTYPE(c_int, POINTER(AcmDevice), POINTER(c_void_p))
CLOSE = CFUNCTYPE(None, c_void_p)
OPEN_PORT = CFUNCTYPE(c_int, POINTER(AcmPort), c_void_p, POINTER(c_void_p))
OPEN_ENDPOINT = CFUNCTYPE(c_int, POINTER(AcmEndpoint), c_void_p, POINTER(c_void_p))
ADD_ADDRESS = CFUNCTYPE(c_int, POINTER(AcmAddress), c_void_p, POINTER(c_void_p))
REQUEST = CFUNCTYPE(c_int, c_void_p, c_void_p, c_uint64)
HANDLE_EVENT = CFUNCTYPE(c_int, c_void_p, c_int)
QUERY_PERF = CFUNCTYPE(None, c_void_p, POINTER(c_uint64), POINTER(c_uint8))


class AcmProvider(ctypes.Structure):
    _fields_ = (
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("name", c_char_p),
        ("open_device", OPEN_DEVICE),
        ("close_device", CLOSE),
        ("open_port", OPEN_PORT),
        ("close_port", CLOSE),
        ("open_endpoint", OPEN_ENDPOINT),
        ("close_endpoint", CLOSE),
        ("add_address", ADD_ADDRESS),
        ("remove_address", CLOSE),
        ("resolve", REQUEST),
        ("query", REQUEST),
        ("handle_event", HANDLE_EVENT),
        ("query_perf", QUERY_PERF),
    )


PROVIDER_QUERY = CFUNCTYPE(c_int, POINTER(POINTER(AcmProvider)), POINTER(ctypes.c_uint32))

# The callbacks of libibacm_core.so (acm_core.c, struct cprov_callbacks).
LOG_CB = CFUNCTYPE(None, c_int, c_char_p)
RESPONSE_CB = CFUNCTYPE(c_int, c_uint64, c_void_p)
SEND_SA_CB = CFUNCTYPE(c_int, c_void_p, c_void_p)
GET_GID_CB = CFUNCTYPE(c_int, c_void_p, c_int, POINTER(c_uint8))
COUNT_CB = CFUNCTYPE(None, c_int)


class Callbacks(ctypes.Structure):
    _fields_ = (
        ("log", LOG_CB),
        ("resolve_response", RESPONSE_CB),
        ("query_response", RESPONSE_CB),
        ("send_sa", SEND_SA_CB),
        ("get_gid", GET_GID_CB),
        ("count", COUNT_CB),
    )
