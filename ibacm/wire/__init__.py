"""Sans-I/O wire codecs: bytes in, objects out, no I/O anywhere in this package.

* ``client``: the ACM client socket protocol (RESOLVE, PERF_QUERY, EP_QUERY) and its framer;
* ``path_record``: the 64-byte SA PathRecord shared by every protocol;
* ``mad``: SA MADs (PathRecord, MCMemberRecord, RMPP); ``acm_mad``: the class 0x2C peer MAD;
* ``netlink``: the kernel's RDMA_NL_LS local-service messages;
* ``rates``: IBA MTU/rate enums and option conversions;
* ``counters``: the ACM counters, each defined once (wire index and every output's name);
* ``buffer`` / ``errors``: the bounds-checked buffer and the ``WireError`` hierarchy.
"""
