"""Default file locations of a distribution build, and the run-time directory layout.

The values are the ones Debian/RHEL packages compile into the C daemon and ``ib_acme``
(``$SYSCONFDIR``=/etc, ``$RUNDIR``=/run, ``$LOCALSTATEDIR``=/var). ``RunPaths`` derives every
socket and port file from one directory so tests and ``ibacm-sim`` can use a private one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SYSCONFDIR = "/etc/rdma"
DEFAULT_OPTS_FILE = f"{SYSCONFDIR}/ibacm_opts.cfg"
DEFAULT_ADDR_FILE = f"{SYSCONFDIR}/ibacm_addr.cfg"
DEFAULT_ROUTE_DATA_FILE = f"{SYSCONFDIR}/ibacm_route.data"
DEFAULT_ADDR_DATA_FILE = f"{SYSCONFDIR}/ibacm_hosts.data"
DEFAULT_LOG_FILE = "/var/log/ibacm.log"
RUNDIR = "/run"
DEFAULT_LOCK_FILE = f"{RUNDIR}/ibacm.pid"
DEFAULT_STATE_DIR = "/var/lib/ibacm"
STATE_DIR_ENV = "STATE_DIRECTORY"
"""Set by systemd for ``StateDirectory=`` (packaging/ibacm.service), and by ``ibacm-sim up`` to
each node's directory."""
# Where the C daemon looks for provider libraries (kept as text: we load no .so files, but the
# value is logged and written into generated option files).
DEFAULT_PROVIDER_LIB_PATH = "/usr/lib/x86_64-linux-gnu/ibacm"

UNIX_SOCKET_NAME = "ibacm-unix.sock"
UNIX_SYMLINK_NAME = "ibacm.sock"
TCP_PORT_FILE_NAME = "ibacm-tcp.port"
PORT_SYMLINK_NAME = "ibacm.port"
ADMIN_SOCKET_NAME = "ibacm-admin.sock"


@dataclass(frozen=True)
class RunPaths:
    """The client-facing files of one daemon instance, all inside ``rundir``."""

    rundir: Path

    @property
    def unix_socket(self) -> Path:
        """The real AF_UNIX listening socket (ib_acme's default ``-S``)."""
        return self.rundir / UNIX_SOCKET_NAME

    @property
    def unix_symlink(self) -> Path:
        """Symlink to ``unix_socket``: the only unix path librdmacm tries."""
        return self.rundir / UNIX_SYMLINK_NAME

    @property
    def tcp_port_file(self) -> Path:
        """Text file holding the TCP port in loop/open mode (read by ib_acme)."""
        return self.rundir / TCP_PORT_FILE_NAME

    @property
    def port_symlink(self) -> Path:
        """Symlink to ``tcp_port_file`` (read by librdmacm)."""
        return self.rundir / PORT_SYMLINK_NAME

    @property
    def admin_socket(self) -> Path:
        """Our addition: the administration socket (not part of the C protocol)."""
        return self.rundir / ADMIN_SOCKET_NAME


def state_dir(environ: Mapping[str, str]) -> Path:
    """Where a daemon keeps state across restarts (a relative ``cache_file`` is taken from
    here): ``$STATE_DIRECTORY`` (its first entry: systemd joins several with colons), else
    ``DEFAULT_STATE_DIR``."""
    given = environ.get(STATE_DIR_ENV, "").split(":")[0]
    return Path(given or DEFAULT_STATE_DIR)
