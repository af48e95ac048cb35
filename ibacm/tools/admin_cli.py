"""``ibacm-admin``: the daemon's admin socket from a shell, for operators without the dashboard.

    ibacm-admin [--admin PATH | --dir SIMDIR --node NAME] [--json] COMMAND ...

Commands: ``status`` (the snapshot, summarised), ``flush`` (the cache, or one endpoint's, or
one destination), ``reload`` (the configuration, as SIGHUP), ``log-level [LEVEL]``,
``capture start PATH | stop | status`` (a MAD capture tshark reads). ``--json`` prints the
daemon's reply as JSON instead (the counters of ``status`` as named fields). The protocol
is docs/admin-protocol.md; the codec is ``ibacm.wire.admin``, shared with the daemon and
``ibacm-tui``.

Exit status: 0 done, 1 the daemon refused or failed the command (its message is printed),
2 a usage error, 3 no daemon to talk to (no socket, permission, timeout, a broken reply).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from ibacm import __version__
from ibacm.config.admin_target import admin_target
from ibacm.wire import admin as wire
from ibacm.wire.counters import Counter

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
DEFAULT_TIMEOUT = 10.0


class Unreachable(Exception):
    """No usable daemon at the other end (exit 3)."""


class Refused(Exception):
    """The daemon answered with an error (exit 1): what to print, one line or more."""


class AdminConnection:
    """One blocking connection: a request out, lines in until its reply (events skipped)."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self._ids = 0
        self._lines = wire.LineBuffer(wire.MAX_SERVER_LINE)
        self._ready: list[bytes | wire.LineTooLong] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
        except FileNotFoundError:
            self._sock.close()
            raise Unreachable(
                f"no admin socket at {path} (is the daemon running? see admin_socket in "
                "ibacm_opts.cfg)"
            ) from None
        except PermissionError:
            self._sock.close()
            raise Unreachable(
                f"permission denied on {path}: the admin socket is owner-only (run as the "
                "daemon's user or root)"
            ) from None
        except OSError as exc:
            self._sock.close()
            raise Unreachable(f"cannot connect to {path}: {exc.strerror or exc}") from None

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> AdminConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, command: wire.Command, **args: Any) -> Any:
        """Send one request; its ``result``, or Refused with the daemon's message."""
        self._ids += 1
        request = wire.Request(command, self._ids, args)
        try:
            self._sock.sendall(wire.encode_request(request))
        except OSError as exc:
            raise Unreachable(f"{self.path}: sending failed: {exc.strerror or exc}") from None
        while True:
            message = self._next_message()
            if isinstance(message, wire.EventMessage) or message.id != self._ids:
                continue
            if message.ok:
                return message.result
            raise Refused(refusal(message))

    def _next_message(self) -> wire.ServerMessage:
        while not self._ready:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                raise Unreachable(f"{self.path}: no answer in time (--timeout)") from None
            except OSError as exc:
                raise Unreachable(f"{self.path}: {exc.strerror or exc}") from None
            if not data:
                raise Unreachable(f"{self.path}: the daemon closed the connection")
            self._ready.extend(self._lines.feed(data))
        line = self._ready.pop(0)
        if isinstance(line, wire.LineTooLong):
            raise Unreachable(f"{self.path}: a reply over {wire.MAX_SERVER_LINE} bytes")
        try:
            return wire.parse_server_message(line)
        except wire.AdminProtocolError as exc:
            raise Unreachable(f"{self.path}: not an ibacm admin reply: {exc}") from None


def refusal(reply: wire.Reply) -> str:
    """An error reply as an operator reads it: a refused reload's summary, then each problem
    on its own line (they are also in the one-line message, for other clients)."""
    code = f" [{reply.code}]" if reply.code else ""
    summary = _get(reply.result, "summary")
    problems = _get(reply.result, "problems")
    if isinstance(summary, str) and isinstance(problems, list):
        return "\n".join([f"{summary}{code}", *(f"  {problem}" for problem in problems)])
    return f"{reply.error}{code}"


# -- commands ----------------------------------------------------------------------------------


def run_command(conn: AdminConnection, args: argparse.Namespace) -> Any:
    """Talk to the daemon for one command; the result to print."""
    conn.call(wire.Command.HELLO, versions=[wire.PROTOCOL_VERSION], client="ibacm-admin")
    if args.command == "status":
        return conn.call(wire.Command.SNAPSHOT)
    if args.command == "flush":
        return conn.call(wire.Command.FLUSH, endpoint=args.endpoint, dest=args.dest)
    if args.command == "reload":
        return conn.call(wire.Command.RELOAD)
    if args.command == "log-level":
        if args.level is None:
            snapshot = conn.call(wire.Command.SNAPSHOT)
            return {"level": _get(snapshot, "daemon", "log_level")}
        return conn.call(wire.Command.SET_LOG_LEVEL, level=args.level)
    if args.command == "capture":
        if args.action == "start":
            return conn.call(wire.Command.CAPTURE, action="start", path=args.path)
        return conn.call(wire.Command.CAPTURE, action=args.action)
    raise AssertionError(f"unhandled command {args.command}")


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def render(args: argparse.Namespace, result: Any) -> str:
    """What an operator reads (``--json``: the daemon's result as it came)."""
    if args.json:
        if args.command == "status":
            result = wire.snapshot_with_named_counters(result)
        return json.dumps(result, indent=2, sort_keys=True)
    if args.command == "status":
        return render_status(result if isinstance(result, dict) else {})
    if args.command == "flush":
        return f"flushed {_get(result, 'flushed')} cache entr(y/ies)"
    if args.command == "reload":
        restart = _get(result, "restart_needed") or []
        if restart:
            return "configuration reloaded; these changes need a restart: " + ", ".join(
                str(option) for option in restart
            )
        return "configuration reloaded"
    if args.command == "log-level":
        return f"log_level {_get(result, 'level')}"
    return render_capture(result if isinstance(result, dict) else {})


def render_capture(result: dict[str, Any]) -> str:
    figures = ", ".join(
        f"{result[key]} {key}" for key in ("records", "dropped", "lost", "bytes") if key in result
    )
    if result.get("error"):
        figures += f"; error: {result['error']}"
    if not result.get("active"):
        last = f" (last: {result['path']}: {figures})" if result.get("path") else ""
        return f"capture off{last}"
    return f"capturing to {result.get('path')}" + (f": {figures}" if figures else "")


def render_status(snapshot: dict[str, Any]) -> str:
    daemon = snapshot.get("daemon", {})
    lines = [
        f"ibacm {daemon.get('version', '?')} pid {daemon.get('pid', '?')}"
        + (f" on {daemon['node']}" if daemon.get("node") else "")
        + f", up {_duration(daemon.get('uptime'))}, log_level {daemon.get('log_level', '?')}"
    ]
    if daemon.get("modules"):
        lines.append(f"modules: {daemon['modules']}")
    counters = snapshot.get("counters") or []
    if counters:
        lines.append(
            "counters: "
            + ", ".join(f"{c.key} {v}" for c, v in zip(Counter, counters, strict=False))
        )
    limits = daemon.get("client_limits")
    if isinstance(limits, dict):
        lines.append(
            f"clients: {limits.get('connected', '?')} connected (at most "
            f"{limits.get('capacity', '?')}), refused {limits.get('refused_total', 0)} + "
            f"{limits.get('refused_user', 0)} per user"
        )
    log_state = daemon.get("log")
    if isinstance(log_state, dict):
        writing = log_state.get("writing_to")
        lines.append(
            f"log: {log_state.get('destination')}"
            + (f" (writing to {writing})" if writing != log_state.get("destination") else "")
            + f", {log_state.get('lost', 0)} line(s) lost"
            + (f"; failing: {log_state.get('error')}" if log_state.get("failing") else "")
        )
    for port in snapshot.get("ports", []):
        shown = " ".join(
            f"{key} {port[key]}" for key in ("lid", "sm_lid", "gid", "mtu", "rate") if key in port
        )
        lines.append(f"port {port.get('id')}: {port.get('state')} {shown}")
    for endpoint in snapshot.get("endpoints", []):
        addresses = [a.get("address") for a in endpoint.get("addresses", [])]
        groups = endpoint.get("groups", [])
        joined = sum(1 for g in groups if g.get("state") == "joined")
        cache = endpoint.get("cache", endpoint.get("entries", []))
        ready = sum(1 for entry in cache if entry.get("state") == "READY")
        lines.append(
            f"endpoint {endpoint.get('id')}: {endpoint.get('state')}, "
            f"{len(cache)} cache entr(y/ies) ({ready} ready), groups {joined}/{len(groups)} "
            f"joined, addresses {', '.join(str(a) for a in addresses) or 'none'}"
        )
    return "\n".join(lines)


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


# -- command line ------------------------------------------------------------------------------


def _capture_path(text: str) -> str:
    # The daemon writes the file: a relative path would land in its working directory.
    return os.path.abspath(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ibacm-admin",
        description="Talk to an ibacm daemon's admin socket: status, flush, reload, log level, "
        "MAD capture.",
    )
    parser.add_argument("--admin", metavar="PATH", help="admin socket of the daemon")
    parser.add_argument("--dir", metavar="SIMDIR", help="directory of an ibacm-sim cluster")
    parser.add_argument("--node", metavar="NAME", help="node of the cluster (with --dir)")
    parser.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SEC",
        help=f"give up on a silent daemon after SEC seconds (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument("--version", action="version", version=f"ibacm-admin {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = commands.add_parser(
        "status", help="the daemon, its ports, endpoints, cache and counters"
    )
    flush = commands.add_parser("flush", help="drop cached destinations (default: all)")
    flush.add_argument("--endpoint", metavar="ID", help="only this endpoint (dev/port/0xpkey)")
    flush.add_argument("--dest", metavar="ADDRESS", help="only this destination")
    reload = commands.add_parser("reload", help="re-read the configuration files (as SIGHUP)")
    level = commands.add_parser("log-level", help="show or set the daemon's log_level")
    level.add_argument("level", nargs="?", type=int, choices=(0, 1, 2), help="0, 1 or 2")
    capture = commands.add_parser("capture", help="MAD capture to a pcap file tshark reads")
    actions = capture.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="start capturing to PATH")
    start.add_argument("path", type=_capture_path, metavar="PATH")
    stop = actions.add_parser("stop", help="stop capturing")
    capture_status = actions.add_parser(
        "status", help="is a capture running, and how much it wrote"
    )
    for command in (status, flush, reload, level, start, stop, capture_status):
        # `ibacm-admin status --json` as well as `ibacm-admin --json status`; SUPPRESS keeps
        # the subcommand from resetting a --json given before it.
        command.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help="as JSON"
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.timeout <= 0:
        print("ibacm-admin: --timeout must be positive", file=sys.stderr)
        return EXIT_USAGE
    try:
        path, _label = admin_target(args.admin, args.dir, args.node)
    except ValueError as exc:
        print(f"ibacm-admin: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with AdminConnection(path, args.timeout) as conn:
            result = run_command(conn, args)
    except Unreachable as exc:
        print(f"ibacm-admin: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except Refused as exc:
        print(f"ibacm-admin: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(render(args, result))
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
