"""The real librdmacm ``rdma_getaddrinfo()`` (ctypes on the distribution's librdmacm.so.1).

Run as ``python -m tests.peers.rdmacm_probe <destination>`` in a mount namespace where
libibverbs sees a (fake) verbs device (real-peers.md §2); prints one JSON object with the
return code and the route (``struct ibv_path_data`` entries: flags, reserved, path record).
"""

from __future__ import annotations

import ctypes
import json
import sys

RDMA_PS_TCP = 0x0106
PATH_DATA_LEN = 72  # struct ibv_path_data


class RdmaAddrinfo(ctypes.Structure):
    pass


RdmaAddrinfo._fields_ = [
    ("ai_flags", ctypes.c_int),
    ("ai_family", ctypes.c_int),
    ("ai_qp_type", ctypes.c_int),
    ("ai_port_space", ctypes.c_int),
    ("ai_src_len", ctypes.c_uint32),
    ("ai_dst_len", ctypes.c_uint32),
    ("ai_src_addr", ctypes.c_void_p),
    ("ai_dst_addr", ctypes.c_void_p),
    ("ai_src_canonname", ctypes.c_char_p),
    ("ai_dst_canonname", ctypes.c_char_p),
    ("ai_route_len", ctypes.c_size_t),
    ("ai_route", ctypes.c_void_p),
    ("ai_connect_len", ctypes.c_size_t),
    ("ai_connect", ctypes.c_void_p),
    ("ai_next", ctypes.POINTER(RdmaAddrinfo)),
]


def getaddrinfo(node: str) -> dict[str, object]:
    lib = ctypes.CDLL("librdmacm.so.1", use_errno=True)
    lib.rdma_getaddrinfo.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.POINTER(RdmaAddrinfo),
        ctypes.POINTER(ctypes.POINTER(RdmaAddrinfo)),
    ]
    hints = RdmaAddrinfo(ai_port_space=RDMA_PS_TCP)
    result = ctypes.POINTER(RdmaAddrinfo)()
    rc = lib.rdma_getaddrinfo(node.encode(), None, ctypes.byref(hints), ctypes.byref(result))
    if rc != 0:
        return {"rc": rc, "errno": ctypes.get_errno()}
    info = result.contents
    route_len = int(info.ai_route_len)
    route = ctypes.string_at(info.ai_route, route_len) if route_len else b""
    lib.rdma_freeaddrinfo(result)
    return {
        "rc": 0,
        "route_len": route_len,
        "paths": [route[i : i + PATH_DATA_LEN].hex() for i in range(0, len(route), PATH_DATA_LEN)],
    }


if __name__ == "__main__":
    print(json.dumps(getaddrinfo(sys.argv[1])))
