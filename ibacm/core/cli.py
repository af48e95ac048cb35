"""The ``ibacm`` command (options.md §8), plus the simulated-fabric and run-directory options.

    ibacm [-D] [-P] [-A addr_file] [-O option_file] [--systemd]
          [--fabric {hw,hw-umad,sim}] [--sim-hub PATH --sim-node NAME] [--run-dir DIR]
          [--version]

Without ``-P`` or ``--systemd`` the daemon detaches (double fork) and the command returns
once it serves, or fails with the daemon's own error message and exit status. Exit statuses:
0 served and stopped cleanly, 1 usage or start-up error (no device, no socket), 255 lock file
held or not writable (as C).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import trio

from ibacm import __version__
from ibacm.config.errors import ConfigIssue, errors_in, invalid_settings
from ibacm.config.option_file import load_options
from ibacm.config.option_values import ServerMode
from ibacm.config.options import Options
from ibacm.config.paths import DEFAULT_ADDR_FILE, DEFAULT_OPTS_FILE
from ibacm.core import gc_policy
from ibacm.core.daemon import Daemon
from ibacm.core.daemonize import Readiness, daemonize
from ibacm.core.listeners import ListenerError
from ibacm.core.logging import LogControl
from ibacm.core.pidfile import LockFileError, PidLock
from ibacm.core.systemd import InheritedSockets, SocketActivationError, take_listen_fds
from ibacm.fabric.api import Fabric, FabricError, NoDevicesError
from ibacm.log import get_logger
from ibacm.sd_notify import Notifier

log = get_logger("ibacm.cli")

SIM_HINT = "To try ibacm without hardware run: ibacm-sim up --nodes 4 --dir /tmp/ibacm-sim"
EXIT_USAGE = 1
EXIT_STARTUP = 1
EXIT_LOCK = 255


class _Parser(argparse.ArgumentParser):
    """Usage on stdout and exit status 1 for bad arguments, as the C daemon."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stdout)
        print(f"{self.prog}: {message}", file=sys.stdout)
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ibacm",
        description="InfiniBand Communication Management Assistant daemon",
    )
    parser.add_argument("-D", dest="daemon", action="store_true", help="run as a daemon (default)")
    parser.add_argument(
        "-P", dest="foreground", action="store_true", help="run as a standard process"
    )
    parser.add_argument(
        "-A",
        dest="addr_file",
        metavar="addr_file",
        default=DEFAULT_ADDR_FILE,
        help=f"address configuration file (default {DEFAULT_ADDR_FILE})",
    )
    parser.add_argument(
        "-O",
        dest="opts_file",
        metavar="option_file",
        default=DEFAULT_OPTS_FILE,
        help=f"option configuration file (default {DEFAULT_OPTS_FILE})",
    )
    parser.add_argument(
        "--systemd",
        action="store_true",
        help="run under systemd: no fork, unix socket mode, socket activation, sd_notify",
    )
    parser.add_argument(
        "--fabric",
        choices=("hw", "hw-umad", "sim"),
        default="hw",
        help="InfiniBand hardware (pyverbs + umad), hw-umad (umad and SA only, no verbs "
        "device: OpenSM on ibsim) or the simulated fabric (default hw)",
    )
    parser.add_argument("--sim-hub", metavar="PATH", help="socket of the simulated fabric hub")
    parser.add_argument("--sim-node", metavar="NAME", help="node of the simulated fabric to be")
    parser.add_argument(
        "--run-dir", metavar="DIR", help="directory of the sockets and port files (run_dir)"
    )
    parser.add_argument(
        "--capture",
        metavar="FILE",
        help="write every MAD sent and received to FILE (pcap of ERF type-21 records)",
    )
    parser.add_argument("--version", action="version", version=f"ibacm {__version__}")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.fabric == "sim" and not (args.sim_hub and args.sim_node):
        parser.error("--fabric sim needs --sim-hub PATH and --sim-node NAME")
    if args.fabric != "sim" and (args.sim_hub or args.sim_node):
        parser.error("--sim-hub and --sim-node need --fabric sim")
    return args


def make_fabric(args: argparse.Namespace) -> Fabric:
    if args.fabric == "sim":
        from ibacm.fabric.sim.hub import HubFabric

        return HubFabric(args.sim_hub, args.sim_node)
    from ibacm.fabric.hw.fabric import HwFabric, HwMode

    # hw-umad: libibumad ports and SA only, no verbs device (OpenSM on ibsim).
    return HwFabric(mode=HwMode.UMAD_ONLY if args.fabric == "hw-umad" else HwMode.VERBS)


def no_device_message(exc: BaseException) -> str:
    """The one line printed when there is nothing to run on."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    lead = "no InfiniBand device found"
    if detail.lower().startswith(lead.lower()):
        detail = detail[len(lead) :].strip(" :")
    reason = f" ({detail.strip('()')})" if detail else ""
    return f"ibacm: {lead}{reason}. {SIM_HINT}"


class _ReportStarted:
    """The ``task_status`` handed to ``Daemon.run``: tells the waiting parent we serve."""

    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness

    def started(self, value: object = None) -> None:
        # Before the parent hears: its first clients do not wait behind the collection.
        gc_policy.settle()
        self.readiness.report(0)


async def _serve(daemon: Daemon, readiness: Readiness) -> None:
    await daemon.run(task_status=_ReportStarted(readiness))


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _fail(
    readiness: Readiness, status: int, message: str, cleanup: Callable[[], None] | None = None
) -> int:
    # The waiting parent exits as soon as it hears: the pid file must be gone before that.
    if cleanup is not None:
        cleanup()
    if readiness.pending:
        readiness.report(status, message)
    else:
        print(message, file=sys.stderr, flush=True)
    return status


def _startup_failure(exc: BaseException, fabric: str) -> tuple[int, str] | None:
    """(status, one-line message) for errors that mean "cannot start", else None."""
    for leaf in _leaves(exc):
        if isinstance(leaf, NoDevicesError):
            if fabric == "sim":
                # Already on the simulated fabric: the hint would not help.
                return EXIT_STARTUP, "ibacm: " + " ".join(str(leaf).split())
            return EXIT_STARTUP, no_device_message(leaf)
        if isinstance(leaf, ListenerError | FabricError):
            return EXIT_STARTUP, f"ibacm: {leaf}"
        if isinstance(leaf, KeyboardInterrupt):
            return 0, ""
    return None


def serve(
    args: argparse.Namespace,
    options: Options,
    issues: Sequence[ConfigIssue],
    readiness: Readiness,
) -> int:
    """Lock file, logging, fabric, then the daemon until it stops (options.md §8 order)."""
    inherited = InheritedSockets()
    if args.systemd:
        try:
            inherited = take_listen_fds()
        except SocketActivationError as exc:
            return _fail(readiness, EXIT_STARTUP, f"ibacm: {exc}")
    lock = PidLock(options.lock_file)
    try:
        lock.acquire()
    except LockFileError as exc:
        inherited.close()
        return _fail(readiness, EXIT_LOCK, f"ibacm: {exc}")
    log_control = LogControl()

    def release() -> None:
        inherited.close()
        lock.release()

    try:
        log_control.configure(
            destination=options.log_file,
            level=options.log_level,
            log_format=options.log_format.value,
        )
        for issue in issues:
            log.warning("option file", problem=str(issue))
        try:
            fabric = make_fabric(args)
        except (FabricError, OSError, ValueError) as exc:
            return _fail(
                readiness,
                EXIT_STARTUP,
                f"ibacm: cannot use the {args.fabric} fabric: {exc}",
                release,
            )
        daemon = Daemon(
            options,
            fabric,
            opts_file=args.opts_file,
            addr_file=args.addr_file,
            inherited_stream=inherited.stream,
            inherited_netlink=inherited.netlink,
            systemd=args.systemd,
            run_dir=args.run_dir,
            capture_file=options.capture_file if args.capture else None,
            log_control=log_control,
            notifier=Notifier.from_environment(),
            handle_signals=True,
        )
        try:
            trio.run(_serve, daemon, readiness)
        except BaseException as exc:
            failure = _startup_failure(exc, args.fabric)
            if failure is None:
                log.exception("ibacm stopped by an unexpected error")
                return _fail(readiness, EXIT_STARTUP, f"ibacm: unexpected error: {exc!r}", release)
            status, message = failure
            if message:
                log.error("cannot start", reason=message)
                return _fail(readiness, status, message, release)
            release()
            readiness.report(status)
            return status
        log.warning("ibacm stopped")
        return 0
    finally:
        inherited.close()
        lock.release()
        log_control.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    options, issues = load_options(args.opts_file)
    errors = errors_in(issues)
    if errors:
        # Before daemonizing, on stderr: a terminal or systemd's journal shows each line.
        for issue in errors:
            print(f"ibacm: {issue}", file=sys.stderr)
        print(f"ibacm: {invalid_settings(errors)}; not started", file=sys.stderr)
        return 1
    if args.run_dir:
        options.run_dir = args.run_dir
    if args.capture:
        # Absolute now: daemonizing changes the working directory to /.
        options.capture_file = os.path.abspath(args.capture)
    if args.systemd:
        options.server_mode = ServerMode.UNIX
    readiness = Readiness(None)
    if not (args.foreground or args.systemd):
        readiness = daemonize()
    return serve(args, options, issues, readiness)


if __name__ == "__main__":
    sys.exit(main())
