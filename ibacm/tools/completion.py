"""Shell completion scripts (bash, zsh) for every command of the project, made by shtab from the
very parsers the commands parse with.

    python -m ibacm.tools.completion --bash-dir DIR --zsh-dir DIR    # DIR/<cmd>, DIR/_<cmd>
    python -m ibacm.tools.completion --print bash ibacm-sim          # one script on stdout

The packages run this at build time (``packaging/debian/rules``, the RPM spec), so shtab is
needed only where they are built. On top of what the parsers declare, the scripts complete
file and directory arguments (by their metavar or name: ``*FILE``, ``*PATH``, ``*DIR``) and the
node names of an ``ibacm-sim`` cluster for ``--node``, ``--sim-node`` and the ``NODE``
operands, read from the cluster directory given on the same command line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import shtab

from ibacm.core import cli
from ibacm.tools import acme_cli, admin_cli, sim, sim_layout

SHELLS = ("bash", "zsh")


def _tui_parser() -> argparse.ArgumentParser:
    # The dashboard's package sits beside this one; imported only when a script is made.
    from tui.app import build_parser

    return build_parser()


PARSERS: tuple[Callable[[], argparse.ArgumentParser], ...] = (
    cli.build_parser,
    acme_cli.argument_parser,
    sim.build_parser,
    admin_cli.build_parser,
    _tui_parser,
)
"""Every command's parser builder; the command is the parser's ``prog``."""

NODE_DESTS = ("node", "sim_node")
"""Arguments that name a node of a cluster."""
CLUSTER_OPTIONS = (("--dir", False), ("--sim-dir", False), ("--sim-hub", True))
"""Options naming the cluster of those nodes: its directory, or a file in it (the hub socket)."""

# Both functions list the subdirectories of the cluster directory that hold a node's option
# file (what `ibacm-sim up` writes), scanning the command line typed so far for the option
# that names the directory. $2 (bash $3): 1 when that option names a file in the directory.
_BASH_NODES = f"""\
# $1: the word being completed; $2: option naming the cluster; $3: 1 if it names a file in it
_ibacm_complete_nodes() {{
  local i dir= file names=()
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${{COMP_WORDS[i]}} in
    "$2")
      dir=${{COMP_WORDS[i+1]-}}
      [[ $dir == = ]] && dir=${{COMP_WORDS[i+2]-}} ;;
    "$2"=*) dir=${{COMP_WORDS[i]#*=}} ;;
    esac
  done
  [[ -n $dir ]] || return 0
  [[ $dir == "~"* ]] && dir=$HOME${{dir#"~"}}
  [[ $3 == 1 ]] && dir=$(dirname -- "$dir")
  for file in "$dir"/*/{sim_layout.OPTS_FILE}; do
    [[ -e $file ]] || continue
    file=${{file%/*}}
    names+=("${{file##*/}}")
  done
  compgen -W "${{names[*]}}" -- "$1"
}}"""
_ZSH_NODES = f"""\
# $1: option naming the cluster; $2: 1 if it names a file in it
_ibacm_complete_nodes() {{
  local i dir=
  local -a nodes
  for ((i = 1; i < CURRENT; i++)); do
    case $words[i] in
      (${{(b)1}}) dir=$words[i+1] ;;
      (${{(b)1}}=*) dir=${{words[i]#*=}} ;;
    esac
  done
  [[ -n $dir ]] || return 1
  dir=${{dir/#\\~/$HOME}}
  [[ $2 == 1 ]] && dir=${{dir:h}}
  nodes=( $dir/*/{sim_layout.OPTS_FILE}(N:h:t) )
  compadd -a nodes
}}"""
_PREAMBLES = {"bash": _BASH_NODES, "zsh": _ZSH_NODES}


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Command name -> its parser, with the completers below attached."""
    built = [make() for make in PARSERS]
    for parser in built:
        _attach(parser, parser)
    return {parser.prog: parser for parser in built}


def _attach(parser: argparse.ArgumentParser, root: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _attach(sub, root)
            continue
        completer = _completer(action, parser, root)
        if completer is not None:
            # shtab reads the completion of an action from this attribute.
            setattr(action, "complete", completer)  # noqa: B010


def _completer(
    action: argparse.Action, parser: argparse.ArgumentParser, root: argparse.ArgumentParser
) -> shtab.CompleteType | None:
    if action.dest in NODE_DESTS:
        return _nodes(parser, root)
    if action.nargs == 0 or action.choices is not None:
        return None
    name = (action.metavar if isinstance(action.metavar, str) else action.dest).lower()
    if name.endswith("dir"):
        return shtab.DIRECTORY
    if name.endswith(("file", "path")):
        return shtab.FILE
    return None


def _nodes(parser: argparse.ArgumentParser, root: argparse.ArgumentParser) -> shtab.CompleteType:
    for source in (parser, root):
        for option, names_a_file in CLUSTER_OPTIONS:
            if option in source._option_string_actions:
                function = f"_ibacm_nodes_{shtab.wordify(option)}"
                flag = int(names_a_file)
                return {
                    "bash": function,
                    "zsh": function,
                    "preamble": {
                        "bash": f'{function}() {{ _ibacm_complete_nodes "$1" {option} {flag}; }}',
                        "zsh": f"{function}() {{ _ibacm_complete_nodes {option} {flag} }}",
                    },
                }
    raise ValueError(f"{parser.prog}: a node argument without a cluster option")


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of one command for one shell."""
    return shtab.complete(parser, shell, preamble=_PREAMBLES[shell])


def file_name(command: str, shell: str) -> str:
    """Where bash-completion and zsh look: ``completions/<cmd>``, ``_<cmd>`` in ``$fpath``."""
    return command if shell == "bash" else f"_{command}"


def write_all(directories: dict[str, Path]) -> list[Path]:
    """Every command's script for each shell into its directory (created); the paths written."""
    written = []
    for command, parser in parsers().items():
        for shell, directory in directories.items():
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / file_name(command, shell)
            path.write_text(script(parser, shell))
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ibacm.tools.completion",
        description="Write the bash and zsh completion scripts of ibacm's commands.",
    )
    parser.add_argument("--bash-dir", type=Path, metavar="DIR", help="write DIR/<command>")
    parser.add_argument("--zsh-dir", type=Path, metavar="DIR", help="write DIR/_<command>")
    parser.add_argument(
        "--print", nargs=2, metavar=("SHELL", "COMMAND"), help="print one script on stdout"
    )
    args = parser.parse_args(argv)
    if args.print:
        shell, command = args.print
        known = parsers()
        if shell not in SHELLS or command not in known:
            parser.error(f"--print: SHELL is one of {SHELLS}, COMMAND one of {tuple(known)}")
        sys.stdout.write(script(known[command], shell))
        return 0
    directories = {
        shell: path
        for shell, path in (("bash", args.bash_dir), ("zsh", args.zsh_dir))
        if path is not None
    }
    if not directories:
        parser.error("give --bash-dir, --zsh-dir or --print")
    for path in write_all(directories):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
