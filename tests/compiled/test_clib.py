"""The project's small C libraries, built with the system compiler (ibacm.compiled.clib): once per
source version, into the library cache, under a hash of the sources."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from ibacm.compiled.clib import HEADERS, CBuildError, cache_dir, ensure_library
from tests.conftest import require_file, require_peer


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    require_peer("cc")
    for header in HEADERS:  # libibverbs-dev, libibumad-dev: every library here needs them
        require_file(header)
    monkeypatch.setenv("IBACM_LIB_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def source(tmp_path: Path, value: int) -> Path:
    path = tmp_path / "probe.c"
    path.write_text(
        f'__attribute__((visibility("default"))) int answer(void) {{ return {value}; }}\n'
    )
    return path


def test_built_once_per_source_version(tmp_path: Path, cache: Path) -> None:
    first = ensure_library("probe", [source(tmp_path, 42)])
    assert first.parent == cache and first.name.startswith("probe-")
    assert ctypes.CDLL(str(first)).answer() == 42
    built = first.stat().st_mtime_ns
    assert ensure_library("probe", [source(tmp_path, 42)]) == first  # not built again
    assert first.stat().st_mtime_ns == built
    second = ensure_library("probe", [source(tmp_path, 43)])  # a changed source: a new build
    assert second != first and second.parent == cache
    assert ctypes.CDLL(str(second)).answer() == 43
    assert sorted(cache.iterdir()) == sorted([first, second])  # no scratch left behind


def test_a_source_that_does_not_compile_is_a_clear_error(tmp_path: Path, cache: Path) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("int answer(void) { return }\n")
    with pytest.raises(CBuildError, match=r"(?s)building broken failed:\n.*broken.c:1:27: error"):
        ensure_library("broken", [broken])
    assert list(cache.iterdir()) == []


def test_the_cache_directory_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("IBACM_LIB_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "ibacm"
    monkeypatch.setenv("IBACM_LIB_DIR", str(tmp_path / "lib"))
    assert cache_dir() == tmp_path / "lib"


def test_a_compiler_that_is_not_there_is_a_clear_error(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(CBuildError, match=r"cannot run the C compiler .*no-such-cc.* build probe"):
        ensure_library("probe", [source(tmp_path, 7)])
    assert list(cache.iterdir()) == []
