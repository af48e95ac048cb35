"""Shell completion: the scripts ``python -m ibacm.tools.completion`` writes, run by a real bash
(``complete -p``, completion functions driven by ``COMP_WORDS`` as bash drives them) and loaded
by a real zsh, against a real ``ibacm-sim up`` cluster for the node names."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibacm.tools import acme_cli, completion, sim
from tests.conftest import REPO, require_peer, sim_cluster
from tests.packaging.shells import bash_complete, zsh_complete

SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Shell -> the directory the scripts were written to, by the module's command line."""
    out = tmp_path_factory.mktemp("completion")
    directories = {"bash": out / "bash", "zsh": out / "zsh"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ibacm.tools.completion",
            "--bash-dir",
            str(directories["bash"]),
            "--zsh-dir",
            str(directories["zsh"]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 2 * len(SCRIPTS)
    return directories


@pytest.fixture(scope="module")
def cluster() -> Iterator[Path]:
    with sim_cluster("completion", "--nodes", "3") as directory:
        yield directory


NODES = ["node1", "node2", "node3"]


def test_every_command_gets_a_script_bash_registers(scripts: dict[str, Path]) -> None:
    assert sorted(completion.parsers()) == sorted(SCRIPTS)
    for command in SCRIPTS:
        script = scripts["bash"] / command
        spec, _ = bash_complete(script, command, "")
        function = "_shtab_" + command.replace("-", "_")
        assert spec == f"complete -o bashdefault -F {function} {command}"
        assert (scripts["zsh"] / f"_{command}").read_text().startswith(f"#compdef {command}\n")


def test_ibacm_sim_subcommands_and_their_flags(scripts: dict[str, Path]) -> None:
    script = scripts["bash"] / "ibacm-sim"
    subparsers = next(
        a for a in sim.build_parser()._actions if isinstance(a.choices, dict) and a.choices
    )
    assert isinstance(subparsers.choices, dict)
    expected = list(subparsers.choices)
    assert {"up", "down", "status", "stop", "start", "restart", "stats"} <= set(expected)
    assert bash_complete(script, "ibacm-sim", "")[1] == expected
    assert bash_complete(script, "ibacm-sim", "port-")[1] == ["port-down", "port-up"]
    flags = bash_complete(script, "ibacm-sim", "up", "--")[1]
    assert {"--dir", "--nodes", "--topology", "--c-ibacm", "--route-prot", "--loss"} <= set(flags)
    assert bash_complete(script, "ibacm-sim", "down", "--")[1] == ["--help", "--dir", "--grace"]
    assert bash_complete(script, "ibacm-sim", "up", "--route-prot", "")[1] == ["sa", "acm"]
    assert bash_complete(script, "ibacm-sim", "flap", "--dir", ".", "--d")[1] == [
        "--dir",
        "--device",
        "--down-for",
    ]


def test_node_names_come_from_the_cluster_directory(
    scripts: dict[str, Path], cluster: Path
) -> None:
    bash = scripts["bash"]
    where = str(cluster)
    for command in ("flap", "port-down", "port-up", "set-lid", "move-sm", "reregister", "exec"):
        line = ("ibacm-sim", command, "--dir", where)
        assert bash_complete(bash / "ibacm-sim", *line, "")[1] == NODES, command
        assert bash_complete(bash / "ibacm-sim", *line, "node2")[1] == ["node2"], command
    # Without a cluster directory there is nothing to offer.
    assert bash_complete(bash / "ibacm-sim", "ibacm-sim", "flap", "")[1] == []
    for command in ("ibacm-admin", "ibacm-tui"):
        line = (command, "--dir", where, "--node")
        assert bash_complete(bash / command, *line, "")[1] == NODES, command
    acme = ("ib_acme", "--fabric", "sim", "--sim-dir", where, "--sim-node", "")
    assert bash_complete(bash / "ib_acme", *acme)[1] == NODES
    hub = ("ibacm", "--fabric", "sim", "--sim-hub", str(cluster / "hub.sock"), "--sim-node", "")
    assert bash_complete(bash / "ibacm", *hub)[1] == NODES
    # A directory that is no cluster has no nodes, even with subdirectories.
    assert bash_complete(bash / "ibacm-tui", "ibacm-tui", "--dir", "/", "--node", "")[1] == []


def test_files_and_directories(scripts: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "net.topo").write_text("")
    (tmp_path / "nodes").mkdir()
    prefix = str(tmp_path) + "/"
    sim_script = scripts["bash"] / "ibacm-sim"
    files = bash_complete(sim_script, "ibacm-sim", "up", "--topology", prefix)[1]
    assert sorted(files) == [prefix + "net.topo", prefix + "nodes"]
    dirs = bash_complete(scripts["bash"] / "ibacm-admin", "ibacm-admin", "--dir", prefix)[1]
    assert dirs == [prefix + "nodes"]
    acme = bash_complete(scripts["bash"] / "ib_acme", "ib_acme", "-O", "-D", prefix)[1]
    assert acme == [prefix + "nodes"]


def test_ib_acme_completes_the_options_its_getopt_parses(scripts: dict[str, Path]) -> None:
    script = scripts["bash"] / "ib_acme"
    spec = acme_cli._parse_optstring(acme_cli.OPTSTRING)
    expected = {f"-{letter}" for letter in spec} | {f"--{name}" for name in acme_cli.LONG_OPTIONS}
    assert set(bash_complete(script, "ib_acme", "-")[1]) == expected
    assert bash_complete(script, "ib_acme", "-f", "")[1] == list(acme_cli.FORMATS)
    assert bash_complete(script, "ib_acme", "--fabric", "")[1] == list(acme_cli.FABRICS)
    # The argparse view reads a command line as getopt does: the same options, same values.
    argv = ["-f", "n", "-s", "node1", "-d", "node2", "-v", "-C", "3", "--timeout", "2", "-Pcol"]
    options, _ = acme_cli.getopt(argv)
    parsed = vars(acme_cli.argument_parser().parse_args(argv))
    given = {k.replace("_", "-"): v for k, v in parsed.items() if v not in (None, False)}
    assert given == {o.name: o.value if o.value is not None else True for o in options}


def test_ibacm_and_ibacm_admin(scripts: dict[str, Path]) -> None:
    ibacm = scripts["bash"] / "ibacm"
    assert bash_complete(ibacm, "ibacm", "--fabric", "")[1] == ["hw", "hw-umad", "sim"]
    admin = scripts["bash"] / "ibacm-admin"
    commands = bash_complete(admin, "ibacm-admin", "")[1]
    assert commands == ["status", "flush", "reload", "log-level", "capture"]
    assert bash_complete(admin, "ibacm-admin", "capture", "")[1] == ["start", "stop", "status"]
    assert bash_complete(admin, "ibacm-admin", "log-level", "")[1] == ["0", "1", "2"]


def test_zsh_loads_every_script(scripts: dict[str, Path]) -> None:
    zsh = require_peer("zsh")
    for script in sorted(scripts["zsh"].iterdir()):
        check = subprocess.run([zsh, "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, f"{script.name}: {check.stderr}"
    # compinit finds them on $fpath and binds each command to its function.
    program = (
        f"fpath=({scripts['zsh']} $fpath); autoload -U compinit; compinit -u -D; "
        + "; ".join(f"print -r -- {c}=$_comps[{c}]" for c in SCRIPTS)
    )
    done = subprocess.run(
        [zsh, "-f", "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"{c}=_{c}" for c in SCRIPTS]


def test_zsh_completes_subcommands_flags_choices_and_nodes(
    scripts: dict[str, Path], cluster: Path
) -> None:
    zsh = scripts["zsh"]
    subcommands = sorted(bash_complete(scripts["bash"] / "ibacm-sim", "ibacm-sim", "")[1])
    assert {"up", "down", "restart", "stats"} <= set(subcommands)
    assert zsh_complete(zsh, "ibacm-sim ") == subcommands
    assert zsh_complete(zsh, "ibacm-sim up --route-") == ["--route-prot"]
    assert zsh_complete(zsh, "ib_acme -f ") == sorted(acme_cli.FORMATS)
    assert zsh_complete(zsh, f"ibacm-sim port-down --dir {cluster} ") == NODES
    assert zsh_complete(zsh, f"ibacm-admin --dir {cluster} --node ") == NODES
    assert zsh_complete(zsh, f"ibacm --sim-hub {cluster}/hub.sock --sim-node ") == NODES


def test_print_one_script_or_say_what_is_known() -> None:
    command = [sys.executable, "-m", "ibacm.tools.completion", "--print"]
    done = subprocess.run([*command, "bash", "ibacm-sim"], capture_output=True, text=True)
    assert done.returncode == 0 and "complete -o bashdefault -F _shtab_ibacm_sim" in done.stdout
    bad = subprocess.run([*command, "fish", "ibacm-sim"], capture_output=True, text=True)
    assert bad.returncode == 2 and "SHELL is one of ('bash', 'zsh')" in bad.stderr
