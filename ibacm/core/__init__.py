"""The ibacm daemon core: life cycle, devices/ports/endpoints, client sockets, dispatch.

Rooms: ``daemon`` (the root nursery, shutdown, reload, the admin ``DaemonControl``),
``topology`` (devices, ports, endpoints, addresses over time), ``model`` (their tables and
lookups), ``addresses`` (which addresses an endpoint gets), ``dispatch`` (client requests to
replies), ``clients`` and ``listeners`` (connections and listening sockets), ``sa`` and
``services`` (what providers get from the core), ``srcaddr`` (automatic source selection),
``logging``, ``systemd``, ``pidfile``, ``daemonize`` and ``cli`` (the ``ibacm`` command).
``admin`` and ``events`` serve the admin socket.
"""
