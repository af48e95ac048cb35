"""Finding, checking and choosing resolution providers.

Providers are classes named by entry points of the group ``ibacm.providers`` (the Python form
of C's ``provider_lib_path`` directory of ``.so`` files). Each is checked like C checks
``provider_query``: it must be a ``Provider`` subclass whose ``api_version`` equals
``PROVIDER_API_VERSION``; anything else is logged as an error and skipped, never fatal.

Port assignment follows the ``provider`` option lines: ``provider <name> <subnet prefix>``
maps a GID-0 subnet prefix to a provider (first matching line wins, lines naming a provider
that is not loaded are ignored); every other port gets the default provider, which is
``provider <name> default`` if that provider is loaded, else ``ibacmp``, else the only
provider there is.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ibacm.log import get_logger
from ibacm.provider.api import (
    ENTRY_POINT_GROUP,
    PROVIDER_API_VERSION,
    CoreServices,
    Provider,
)

log = get_logger("ibacm.provider")

DEFAULT_PROVIDER = "ibacmp"


@dataclass(frozen=True, slots=True)
class ProviderEntry:
    """A provider class that passed the checks."""

    name: str
    cls: type[Provider]
    origin: str
    """Where it came from (``module:Class`` of the entry point), for logs."""


@dataclass(frozen=True, slots=True)
class RejectedProvider:
    origin: str
    reason: str


def check_provider_class(obj: object, origin: str) -> ProviderEntry:
    """Validate a loaded entry-point object; raises TypeError with the reason."""
    if not isinstance(obj, type) or not issubclass(obj, Provider):
        raise TypeError(f"{origin} is not an ibacm.provider.api.Provider subclass")
    version = getattr(obj, "api_version", None)
    if version != PROVIDER_API_VERSION:
        raise TypeError(
            f"{origin} implements provider API version {version!r}; "
            f"this ibacm needs version {PROVIDER_API_VERSION}"
        )
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name or len(name.encode()) > 63:
        # The name travels in EP_QUERY replies as a NUL-terminated 64-byte string.
        raise TypeError(f"{origin} has no valid 'name' (1..63 bytes)")
    return ProviderEntry(name, obj, origin)


def discover_providers(
    group: str = ENTRY_POINT_GROUP,
) -> tuple[list[ProviderEntry], list[RejectedProvider]]:
    """Load every entry point of ``group``; returns the good ones and the reasons for the rest."""
    found: list[ProviderEntry] = []
    rejected: list[RejectedProvider] = []
    seen: set[str] = set()
    for entry_point in sorted(importlib.metadata.entry_points(group=group), key=_ep_key):
        origin = f"{entry_point.name} = {entry_point.value}"
        try:
            obj = entry_point.load()
            entry = check_provider_class(obj, origin)
        except Exception as exc:  # a broken provider must not stop the daemon
            reason = f"{type(exc).__name__}: {exc}"
            rejected.append(RejectedProvider(origin, reason))
            log.error("provider skipped", provider=origin, reason=reason)
            continue
        if entry.name.lower() in seen:
            reason = f"a provider named {entry.name!r} is already loaded"
            rejected.append(RejectedProvider(origin, reason))
            log.error("provider skipped", provider=origin, reason=reason)
            continue
        seen.add(entry.name.lower())
        found.append(entry)
        log.info("provider loaded", provider=entry.name, origin=origin)
    return found, rejected


def _ep_key(entry_point: importlib.metadata.EntryPoint) -> tuple[str, str]:
    # Deterministic load order (C read a directory, whose order is arbitrary).
    return entry_point.name, entry_point.value


def merge_libraries(
    python: Sequence[ProviderEntry], libraries: Sequence[ProviderEntry], *, prefer_library: bool
) -> list[ProviderEntry]:
    """Python providers and provider libraries in one list; of two with one name (any case)
    the preferred kind stays (``provider_prefer``), and the log says which went where."""
    merged = list(python)
    index = {entry.name.lower(): n for n, entry in enumerate(merged)}
    for library in libraries:
        key = library.name.lower()
        if key not in index:
            index[key] = len(merged)
            merged.append(library)
            continue
        kept = merged[index[key]]
        if prefer_library and kept in python:
            merged[index[key]] = library
            kept, library = library, kept
        log.info(
            "provider name taken",
            provider=kept.name,
            used=kept.origin,
            not_used=library.origin,
            rule="provider_prefer " + ("library" if prefer_library else "python"),
        )
    return merged


@dataclass(frozen=True, slots=True)
class PrefixRule:
    """``provider <name> <prefix>``: ports whose GID-0 subnet prefix is ``prefix``."""

    prefix: int
    provider: str


class ProviderSet:
    """The provider instances of one daemon and the rule that assigns them to ports."""

    def __init__(
        self,
        providers: Mapping[str, Provider],
        *,
        default: str | None = None,
        rules: Sequence[PrefixRule] = (),
    ) -> None:
        self._by_name = {name.lower(): provider for name, provider in providers.items()}
        self.providers: tuple[Provider, ...] = tuple(providers.values())
        self.default = self._choose_default(default)
        self.rules: tuple[PrefixRule, ...] = tuple(
            rule for rule in rules if self._known(rule.provider, "subnet prefix line")
        )

    def _known(self, name: str, what: str) -> bool:
        if name.lower() in self._by_name:
            return True
        log.warning("provider line ignored: provider not loaded", provider=name, line=what)
        return False

    def _choose_default(self, name: str | None) -> Provider | None:
        if name is not None and self._known(name, "default"):
            return self._by_name[name.lower()]
        if DEFAULT_PROVIDER in self._by_name:
            return self._by_name[DEFAULT_PROVIDER]
        if len(self.providers) == 1:
            return self.providers[0]
        return None

    def get(self, name: str) -> Provider | None:
        return self._by_name.get(name.lower())

    def for_subnet(self, subnet_prefix: int) -> Provider | None:
        """The provider that serves a port with this GID-0 subnet prefix (first rule wins)."""
        for rule in self.rules:
            if rule.prefix == subnet_prefix:
                return self._by_name[rule.provider.lower()]
        return self.default

    @classmethod
    def create(
        cls,
        entries: Iterable[ProviderEntry],
        core: CoreServices,
        *,
        default: str | None = None,
        rules: Sequence[PrefixRule] = (),
    ) -> ProviderSet:
        """Instantiate each provider once with the core's services."""
        instances: dict[str, Provider] = {}
        for entry in entries:
            try:
                instance = entry.cls(core)
                instance.origin = entry.origin
                instances[entry.name] = instance
            except Exception as exc:  # skip it like a failed provider_query
                log.error("provider skipped", provider=entry.name, reason=f"{exc!r}")
        return cls(instances, default=default, rules=rules)

    async def start(self) -> None:
        """Call ``start`` of every provider; one that fails is dropped (logged)."""
        failed: list[Provider] = []
        for provider in self.providers:
            try:
                await provider.start()
            except Exception as exc:
                log.error("provider failed to start", provider=provider.name, error=repr(exc))
                failed.append(provider)
        for provider in failed:
            self._drop(provider)

    def _drop(self, provider: Provider) -> None:
        self._by_name = {k: v for k, v in self._by_name.items() if v is not provider}
        self.providers = tuple(p for p in self.providers if p is not provider)
        if self.default is provider:
            self.default = self._choose_default(None)
        self.rules = tuple(r for r in self.rules if r.provider.lower() in self._by_name)

    async def stop(self) -> None:
        for provider in self.providers:
            try:
                await provider.stop()
            except Exception as exc:  # the others still get their stop()
                log.error("provider failed to stop", provider=provider.name, error=repr(exc))
