"""Files a daemon on the simulated fabric reads, written from what the fabric is now.

``route_dump`` is an OpenSM ``dump_pr`` "full" file (``route_preload opensm_full_v1``);
``hosts_file`` an ``ibacm_hosts.data`` (acm_hosts) file.
"""

from __future__ import annotations

import ipaddress

from ibacm.config.route_file import RoutePath, RouteSection, render_route_file
from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.runtime import SwitchEndpoint


def route_dump(directory: Directory) -> str:
    """An OpenSM ``dump_pr`` "full" file of the fabric (``route_preload opensm_full_v1``)."""
    endpoints = directory.endpoints()
    sections = []
    for src in endpoints:
        paths = []
        unreachable = []
        for dst in endpoints:
            info = directory.router.path(src.guid, dst.guid)
            if info is None:
                unreachable.append(dst.lid)
            else:
                paths.append(RoutePath(dst.lid, 0, info.mtu, info.rate))
        if isinstance(src, SwitchEndpoint):
            kind, description, port_num = "Switch", src.description, 0
        else:
            kind, description, port_num = "Channel Adapter", src.device.description, src.num
        sections.append(
            RouteSection(kind, src.guid, src.lid, description, port_num, paths, tuple(unreachable))
        )
    return render_route_file(sections)


def hosts_file(directory: Directory) -> str:
    """An ``ibacm_hosts.data`` (acm_hosts) file: every node name and address -> port GID."""
    lines = ["# ibacm_hosts.data generated from the simulated fabric"]
    for host in directory.hosts:
        first = next((p for d in host.devices for p in d.ports if p.lid), None)
        if first is not None:
            lines.append(f"{host.name} {ipaddress.IPv6Address(first.gid0)}")
        for entry in host.addresses:
            lines.append(f"{entry.address} {ipaddress.IPv6Address(entry.gid)}")
    return "\n".join(lines) + "\n"
