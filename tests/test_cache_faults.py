"""The decision cache can never break a call: whatever is wrong with it is warned about, naming the
cache path, and the decision goes on without it (in this process: no ranks needed)."""

from __future__ import annotations

import json

import pytest

from tilefuse.ops import dispatch, registry
from tilefuse.tuning import cache

OP = "all_gather_gemm"
CFG = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4, "num_stages": 1,
       "GEMM_SMS": 4, "COMM_SMS": 0}


def _key(M=64):
    return cache.entry_key("cpu", 2, OP, "float32", 32, 48, dispatch.m_bucket(M))


@pytest.fixture
def warnings_seen(caplog):
    cache._WARNED.clear()
    with caplog.at_level("WARNING", logger="tilefuse"):
        yield caplog


def test_an_unusable_cache_directory_is_passed_over_with_a_warning(tmp_path, monkeypatch, warnings_seen):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(blocker / "below"))
    assert cache.decision(_key(), OP, registry.variants(OP)) is None
    assert dispatch._local_view(OP, "cpu", 2, 64, 32, 48, "float32") is None  # no table covers the cpu
    assert f"autotune cache {blocker / 'below'}" in warnings_seen.text
    assert "NotADirectoryError" in warnings_seen.text and "deciding without it" in warnings_seen.text


def test_an_unreadable_or_malformed_file_is_passed_over_with_a_warning(tmp_path, monkeypatch, warnings_seen):
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))
    (tmp_path / cache.FILE_NAME).mkdir()  # a directory where the file should be: unreadable
    assert cache.decision(_key(), OP, registry.variants(OP)) is None
    assert str(tmp_path / cache.FILE_NAME) in warnings_seen.text
    (tmp_path / cache.FILE_NAME).rmdir()
    (tmp_path / cache.FILE_NAME).write_text("{ not json")
    assert cache.decision(_key(), OP, registry.variants(OP)) is None
    assert "not valid JSON" in warnings_seen.text


def test_an_entry_the_variant_refuses_is_passed_over_naming_the_cache(tmp_path, monkeypatch, warnings_seen):
    """A config with a field only bulk_sync takes (SPLIT_K > 1) on fused_sequential, a
    producer_consumer config without communication programs, more programs than the device has, a
    variant the op lacks: each is warned about and ignored; a good entry is used."""
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))
    entries = {
        _key(16): {"variant": "fused_sequential", "config": dict(CFG, SPLIT_K=2)},
        _key(64): {"variant": "producer_consumer", "config": CFG},
        _key(256): {"variant": "bulk_sync", "config": dict(CFG, GEMM_SMS=64)},
        _key(1024): {"variant": "bulk_sync", "config": dict(CFG, SPLIT_K=2)},
    }
    cache.put(entries)
    raw = json.loads((tmp_path / cache.FILE_NAME).read_text())
    raw["entries"][_key(4096)] = {"variant": "copy_engine", "config": None}  # (a variant of some ops only)
    (tmp_path / cache.FILE_NAME).write_text(json.dumps(raw))
    variants = registry.variants(OP)
    without = {k: v for k, v in variants.items() if k != "copy_engine"}
    for M, why in ((16, "SPLIT_K=2"), (64, "COMM_SMS >= 1"), (256, "exceeds the 8 multiprocessors"),
                   (4096, "no variant 'copy_engine'")):
        assert cache.decision(_key(M), OP, without, num_sms=8) is None, M
        assert why in warnings_seen.text, (M, warnings_seen.text)
    assert f"autotune cache {tmp_path / cache.FILE_NAME}: entry" in warnings_seen.text
    entry, cfg = cache.decision(_key(1024), OP, variants, num_sms=8)
    assert entry["variant"] == "bulk_sync" and cfg.SPLIT_K == 2
    assert dispatch._local_view(OP, "cpu", 2, 16, 32, 48, "float32") is None
