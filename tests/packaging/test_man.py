"""Man pages: they render cleanly with the real man(1) and say what the code does."""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ibacm
from ibacm.core import cli
from ibacm.fabric.sim.faults import Faults
from ibacm.provider import api
from ibacm.provider.registry import check_provider_class
from ibacm.tools import acme_cli, sim
from tests.conftest import REPO, require_peer

MAN = REPO / "packaging" / "man"
PAGES = [
    "ibacm.8",
    "ib_acme.1",
    "ibacm.7",
    "ibacm_prov.7",
    "ibacm-tui.1",
    "ibacm-sim.1",
    "ibacm-admin.8",
]
BIN = Path(sys.executable).parent


def render(page: str) -> str:
    """The page as man(1) shows it, 80 columns; fails on any groff warning."""
    man = require_peer("man")
    env = {**os.environ, "MANWIDTH": "80", "LC_ALL": "C.UTF-8", "MANPAGER": "cat"}
    env.pop("MANOPT", None)
    done = subprocess.run(
        [man, "--warnings=all", "-l", str(MAN / page)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", f"{page}: {done.stderr}"
    return done.stdout


def source(page: str) -> str:
    return (MAN / page).read_text(encoding="utf-8")


def plain(text: str) -> str:
    """Rendered text with hyphenation at line ends undone and spaces collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"(\w)\u2010\n\s*(\w)", r"\1\2", text))


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_without_warnings(page: str) -> None:
    text = render(page)
    name, section = page.rsplit(".", 1)
    assert text.startswith(f"{name.upper()}({section})")
    for heading in ("NAME", "DESCRIPTION", "SEE ALSO"):
        assert re.search(rf"^{heading}$", text, re.MULTILINE), f"{page}: no {heading}"


@pytest.mark.parametrize("page", PAGES)
def test_page_header_names_the_release(page: str) -> None:
    name, section = page.rsplit(".", 1)
    header = source(page).splitlines()[0]
    title = name.upper().replace("-", "\\-")
    assert header.startswith(f".TH {title} {section} ")
    assert f'"ibacm {ibacm.__version__}"' in header


@pytest.mark.parametrize("page", PAGES)
def test_see_also_points_at_pages_that_exist(page: str) -> None:
    ours = {p.rsplit(".", 1)[0] + f"({p.rsplit('.', 1)[1]})" for p in PAGES}
    see_also = plain(render(page)).split("SEE ALSO", 1)[1]
    for ref in re.findall(r"(ib[\w-]+)\((\d)\)", see_also):
        assert f"{ref[0]}({ref[1]})" in ours, f"{page} refers to missing {ref}"


# ---------------------------------------------------------------------------------------------
# ibacm(8): the command line (its option file keys: tests/config/test_option_docs.py)


def _help(command: str) -> str:
    done = subprocess.run(
        [str(BIN / command), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{command} --help failed: {done.stderr}"
    return done.stdout


def _long_options(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", help_text)) - {"--help"}


@pytest.mark.parametrize(
    ("command", "page"),
    [("ibacm", "ibacm.8"), ("ibacm-tui", "ibacm-tui.1"), ("ibacm-admin", "ibacm-admin.8")],
)
def test_page_documents_every_command_line_option(command: str, page: str) -> None:
    options = _long_options(_help(command))
    assert "--version" in options
    text = plain(render(page))
    for option in sorted(options):
        assert option in text, f"{page} does not document {option}"


def test_ibacm_sim1_documents_every_command_and_option() -> None:
    text = plain(render("ibacm-sim.1"))
    parser = sim.build_parser()
    commands = next(
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    )
    assert "up" in commands.choices
    for name, sub in commands.choices.items():
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"command {name}"
        for action in sub._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    assert option in text, f"ibacm-sim {name} {option} is not documented"


def test_ibacm_sim1_documents_every_fault() -> None:
    text = plain(render("ibacm-sim.1"))
    for name in Faults().as_dict():
        assert name in text, f"fault {name} is not documented"


def test_ibacm8_documents_the_short_options() -> None:
    text = plain(render("ibacm.8"))
    for flag in ("-D", "-P", "-A addr_file", "-O opts_file", "--systemd", "--version"):
        assert flag in text


def test_ibacm8_synopsis_lists_every_fabric() -> None:
    synopsis = re.search(r" SYNOPSIS (.*) DESCRIPTION ", plain(render("ibacm.8")))
    assert synopsis is not None
    fabric = next(a for a in cli.build_parser()._actions if "--fabric" in a.option_strings)
    assert fabric.choices is not None
    assert f"[--fabric {'|'.join(fabric.choices)}]" in synopsis.group(1)


def _shared_files() -> dict[str, str]:
    """contrib file -> where the Debian package installs it (packaging/debian/rules)."""
    rules = (REPO / "packaging" / "debian" / "rules").read_text().replace("\\\n", " ")
    found = re.findall(r"install -D -m 0644 contrib/(\S+)\s+\$\(DEST\)(/usr/share/\S+)", rules)
    return {name: path.replace("$(PKG)", "ibacm-trio") for name, path in found}


def test_pages_and_readme_debian_say_where_the_dissector_and_dashboard_are() -> None:
    installed = _shared_files()
    assert sorted(installed) == ["grafana/ibacm-dashboard.json", "wireshark/acm.lua"]
    readme = (REPO / "packaging" / "debian" / "README.Debian").read_text()
    ibacm8 = source("ibacm.8").replace("\\-", "-")
    for path in installed.values():
        assert path in readme, f"README.Debian does not name {path}"
        assert path in ibacm8, f"ibacm(8) does not name {path}"
    assert installed["wireshark/acm.lua"] in source("ibacm-admin.8").replace("\\-", "-")


def test_ib_acme1_documents_every_flag() -> None:
    text = plain(render("ib_acme.1"))
    for flag in acme_cli.OPTSTRING.replace(":", ""):
        assert re.search(rf"(?<![\w-])-{flag}\b", text), f"-{flag} missing"
    for name in acme_cli.LONG_OPTIONS:
        if name != "help":
            assert f"--{name}" in text, f"--{name} missing"
    for sub in ("col", "all"):
        assert sub in text


# ---------------------------------------------------------------------------------------------
# ibacm_prov(7): the provider API


def _example_code() -> str:
    text = source("ibacm_prov.7")
    example = text.split(".SH EXAMPLE", 1)[1]
    code = example.split(".EX\n", 1)[1].split(".EE\n", 1)[0]
    return code.replace("\\-", "-").replace("\\e", "\\").replace("\\&", "")


def test_ibacm_prov7_example_is_an_accepted_provider() -> None:
    namespace: dict[str, object] = {}
    exec(compile(_example_code(), "ibacm_prov.7", "exec"), namespace)
    provider_class = namespace["NullProvider"]
    entry = check_provider_class(provider_class, "ibacm_prov.7 example")
    assert entry.name == "null"
    assert not inspect.isabstract(provider_class)


def test_ibacm_prov7_documents_every_provider_method() -> None:
    text = plain(render("ibacm_prov.7"))
    methods = [
        name
        for name, member in inspect.getmembers(api.Provider, inspect.isfunction)
        if not name.startswith("_")
    ]
    assert "resolve" in methods
    for name in methods:
        assert f"{name}(" in text, f"ibacm_prov(7) does not document Provider.{name}"
    for service in ("options", "counters", "next_tid", "sa_request", "publish"):
        assert f"core.{service}" in text
    assert api.ENTRY_POINT_GROUP in text
    assert f"currently {api.PROVIDER_API_VERSION}" in text
