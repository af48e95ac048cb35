"""Providers from entry points: discovery, checks, ``provider`` lines, port assignment."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibacm.config.option_file import parse_options
from ibacm.config.option_values import ProviderLine
from ibacm.config.options import Options
from ibacm.core.daemon import provider_choice
from ibacm.core.services import DaemonServices
from ibacm.fabric.sim.topo_file import generate
from ibacm.provider.api import ENTRY_POINT_GROUP, Counters
from ibacm.provider.registry import (
    PrefixRule,
    ProviderEntry,
    ProviderSet,
    check_provider_class,
    discover_providers,
)
from ibacm.wire.client import decode_ep_reply, encode_ep_request
from tests.core.provider_pkg.badproviders import (
    FailingStartProvider,
    OldApiProvider,
    OtherProvider,
)
from tests.core.provider_pkg.testprov import TestProvider
from tests.core.support import AcmClient, make_options, sim_daemon

PKG = "tests.core.provider_pkg"
ENTRY_POINTS = f"""\
[{ENTRY_POINT_GROUP}]
testprov = {PKG}.testprov:TestProvider
otherprov = {PKG}.badproviders:OtherProvider
oldapi = {PKG}.badproviders:OldApiProvider
nameless = {PKG}.badproviders:NamelessProvider
plain = {PKG}.badproviders:NotAProvider
missing = {PKG}.no_such_module:Provider
"""


@pytest.fixture
def test_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A test-only installed distribution declaring providers, on sys.path for this test."""
    site = tmp_path / "site"
    info = site / "ibacm_test_providers-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: ibacm-test-providers\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(site))
    return site


def test_discovery_checks_every_entry_point(test_distribution: Path) -> None:
    found, rejected = discover_providers()
    names = {entry.name: entry.cls for entry in found}
    assert names["testprov"] is TestProvider
    assert names["otherprov"] is OtherProvider
    reasons = {item.origin.split(" ")[0]: item.reason for item in rejected}
    assert "API version 0" in reasons["oldapi"]
    assert "needs version 1" in reasons["oldapi"]
    assert "no valid 'name'" in reasons["nameless"]
    assert "not an ibacm.provider.api.Provider subclass" in reasons["plain"]
    assert "ModuleNotFoundError" in reasons["missing"]
    assert not {"oldapi", "nameless", "plain", "missing"} & set(names)


def test_without_the_distribution_the_test_providers_are_unknown() -> None:
    found, _ = discover_providers()
    assert "otherprov" not in {entry.name for entry in found}


def test_check_provider_class_names_the_version() -> None:
    with pytest.raises(TypeError, match="version 0"):
        check_provider_class(OldApiProvider, "x")
    assert check_provider_class(TestProvider, "x").name == "testprov"


def test_provider_lines_choose_default_and_prefix_rules() -> None:
    options, _ = parse_options(
        "provider nosuch default\n"
        "provider otherprov default\n"
        "provider testprov 0xfe80000000000000\n"
        "provider_lib_path /usr/lib/ibacm\n"
        "provider ghost 0x1\n"
    )
    loaded = [
        ProviderEntry("testprov", TestProvider, "t"),
        ProviderEntry("otherprov", OtherProvider, "o"),
    ]
    default, rules = provider_choice(options, loaded)
    assert default == "otherprov"
    assert rules == [PrefixRule(0xFE80000000000000, "testprov"), PrefixRule(1, "ghost")]
    services = DaemonServices(options, Counters(), None)
    providers = ProviderSet.create(loaded, services, default=default, rules=rules)
    assert [rule.provider for rule in providers.rules] == ["testprov"]  # ghost is not loaded
    assert providers.for_subnet(0xFE80000000000000).name == "testprov"  # type: ignore[union-attr]
    assert providers.for_subnet(0xFEC0000000000000).name == "otherprov"  # type: ignore[union-attr]


def test_default_falls_back_to_the_only_provider() -> None:
    services = DaemonServices(Options(), Counters(), None)
    providers = ProviderSet.create([ProviderEntry("otherprov", OtherProvider, "o")], services)
    assert providers.for_subnet(0).name == "otherprov"  # type: ignore[union-attr]
    two = [
        ProviderEntry("otherprov", OtherProvider, "o"),
        ProviderEntry("testprov", TestProvider, "t"),
    ]
    assert ProviderSet.create(two, services).for_subnet(0) is None


@pytest.mark.trio
async def test_a_provider_that_fails_to_start_is_dropped() -> None:
    services = DaemonServices(Options(), Counters(), None)
    entries = [
        ProviderEntry("failstart", FailingStartProvider, "f"),
        ProviderEntry("testprov", TestProvider, "t"),
    ]
    providers = ProviderSet.create(entries, services, default="failstart")
    await providers.start()
    assert [p.name for p in providers.providers] == ["testprov"]
    assert providers.for_subnet(0).name == "testprov"  # type: ignore[union-attr]


@pytest.mark.trio
@pytest.mark.parametrize(
    ("subnet_prefix", "served_by"),
    [(0xFE80000000000000, "testprov"), (0xFEC0000000000000, "otherprov")],
)
async def test_port_served_by_the_provider_mapped_to_its_subnet(
    tmp_path: Path, test_distribution: Path, subnet_prefix: int, served_by: str
) -> None:
    found, _ = discover_providers()
    mine = [entry for entry in found if entry.name in ("testprov", "otherprov")]
    options = make_options(
        tmp_path,
        providers=[
            ProviderLine("otherprov", True, None, 1),
            ProviderLine("testprov", False, 0xFE80000000000000, 2),
        ],
    )
    topology = generate(2)
    topology.subnet_prefix = subnet_prefix
    async with sim_daemon(tmp_path, topology=topology, options=options, providers=mine) as run:
        client = await AcmClient.unix(run.unix_socket)
        _, config = decode_ep_reply(await client.request(encode_ep_request(1)))
        assert config is not None and config.prov_name == served_by
        await client.aclose()
        other = "otherprov" if served_by == "testprov" else "testprov"
        unused = run.daemon.providers.get(other)
        assert isinstance(unused, TestProvider)
        assert not [e for e in unused.events if e[0] == "open_port"]
