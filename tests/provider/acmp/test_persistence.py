"""The cache file itself (ibacm.provider.acmp.persistence.CacheStore): saved whole, read back, and a
file that cannot be used is one clear error (the daemon then starts with an empty cache;
tests/provider/acmp/test_fabric_preload.py shows that side)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio

from ibacm.provider.acmp.persistence import FORMAT, VERSION, CacheFileError, CacheStore

RECORD = {"type": 1, "address": "0a000003", "path": "00" * 64, "addr_expiry": None}


@pytest.mark.trio
async def test_saved_then_loaded_from_the_state_directory(tmp_path: Path) -> None:
    store = CacheStore("cache.json", time.time, tmp_path)
    await store.save({"ep": [RECORD]})
    assert await store.load() == {"ep": [RECORD]}
    assert [p.name for p in tmp_path.iterdir()] == ["cache.json"]  # the temporary renamed
    absolute = CacheStore(str(tmp_path / "elsewhere.json"), time.time, Path("/nonexistent"))
    assert absolute.path == tmp_path / "elsewhere.json"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        (json.dumps({"format": "other"}), "not an ibacm cache file"),
        (json.dumps({"format": FORMAT, "version": VERSION + 1}), f"version {VERSION + 1}"),
        (json.dumps({"format": FORMAT, "version": VERSION, "endpoints": []}), "'endpoints'"),
    ],
)
@pytest.mark.trio
async def test_a_file_that_is_no_cache_file_says_which_problem(
    tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "cache.json").write_text(text)
    with pytest.raises(CacheFileError, match=f"cache.json: .*{message}"):
        await CacheStore("cache.json", time.time, tmp_path).load()


@pytest.mark.trio
async def test_items_that_are_not_records_are_left_out(tmp_path: Path) -> None:
    endpoints = {"ep1": [RECORD, "junk", 3], "ep2": "not a list"}
    document = {"format": FORMAT, "version": VERSION, "endpoints": endpoints}
    (tmp_path / "cache.json").write_text(json.dumps(document))
    assert await CacheStore("cache.json", time.time, tmp_path).load() == {"ep1": [RECORD]}


@pytest.mark.trio
async def test_a_save_that_cannot_be_written_is_a_cache_file_error(tmp_path: Path) -> None:
    store = CacheStore("missing/cache.json", time.time, tmp_path)
    with pytest.raises(CacheFileError, match="missing"):
        await store.save({"ep": [RECORD]})
    assert await trio.to_thread.run_sync(lambda: list(tmp_path.iterdir())) == []
