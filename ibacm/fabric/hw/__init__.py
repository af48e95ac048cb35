"""The hardware fabric backend: real HCAs through pyverbs, the SA through libibumad.

``ibacm.fabric.hw.fabric.HwFabric`` implements ``ibacm.fabric.api.Fabric``:

* ``verbs_device`` / ``ud_qp``: devices, ports, async events and the ACM UD QP through pyverbs
  (Debian's ``python3-pyverbs``, imported lazily by ``pyverbs_loader`` — also from the
  distribution directory when running in a virtualenv); ``verbs_handles`` makes the few
  libibverbs calls pyverbs lacks (multicast attach/detach, event file descriptors, async
  events with their port); ``verbs_attrs`` holds the pure translations to pyverbs objects.
* ``umad`` / ``sa_agent``: SA MADs through libibumad (ctypes), TID matching, timeouts and
  RMPP, received in a worker thread so the same code runs under ibsim's preload.
* ``umad_device``: the umad-only variant (``ibacm --fabric hw-umad``) for OpenSM on ibsim,
  where there is no verbs device.
* ``ipmon`` / ``rtnetlink``: IPoIB addresses enumerated and followed through rtnetlink.
* ``poller``: waiters taking turns to drive a shared event source, so the backend needs no
  background task of its own (a UD QP's ``serve`` is such a waiter: its handler runs in the
  round that read the MADs, whichever waiter drove it).
"""
