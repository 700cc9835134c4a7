"""ferrollama.llama_cache: llama-cpp-python's prefix-keyed state caches, in RAM and on disk."""
from __future__ import annotations

import inspect
import os
from types import SimpleNamespace

import numpy as np
import pytest

from ferrollama import llama_cache as lc


def state(key, state_bytes: int, tag: int = 0):
    """A LlamaState's fields: sized state_bytes + 4 bytes per token (input_ids) + 8 (2 scores of f32)."""
    n = len(key)
    return SimpleNamespace(input_ids=np.asarray(key, dtype=np.intc), scores=np.full((n, 2), tag, dtype=np.float32),
                           n_tokens=n, llama_state=bytes([tag]) * state_bytes, llama_state_size=state_bytes, seed=tag)


@pytest.fixture(params=["ram", "disk"])
def make_cache(request, tmp_path):
    def make(capacity_bytes: int):
        if request.param == "ram":
            return lc.LlamaRAMCache(capacity_bytes=capacity_bytes)
        return lc.LlamaDiskCache(cache_dir=str(tmp_path / "cache"), capacity_bytes=capacity_bytes)

    return make


def keys_of(cache) -> list:
    return cache._keys()  # least recently used first


def test_size_of_a_state():
    assert lc.state_size(state((1, 2, 3), 100)) == 100 + 3 * 4 + 3 * 8


def test_lookup_returns_the_longest_common_prefix(make_cache):
    cache = make_cache(1 << 20)
    cache[(1, 2, 3)] = state((1, 2, 3), 10, tag=1)
    cache[[1, 2, 4, 5]] = state((1, 2, 4, 5), 10, tag=2)
    cache[np.array([9], dtype=np.intc)] = state((9,), 10, tag=3)
    assert cache[(1, 2, 4, 5, 6)].seed == 2
    assert cache[[1, 2, 3, 7]].seed == 1
    assert cache[(9, 9)].seed == 3
    assert cache[(1,)].seed == 2  # a tie: the first in recency order, and (1, 2, 3) was used after (1, 2, 4, 5)
    assert ((7, 1) in cache, (9, 1) in cache, () in cache) == (False, True, False)
    with pytest.raises(KeyError):
        cache[(7,)]
    with pytest.raises(KeyError):
        cache[()]
    got = cache[(1, 2, 4, 5)]
    assert got.input_ids.dtype == np.intc and list(got.input_ids) == [1, 2, 4, 5]
    assert got.scores.dtype == np.float32 and got.scores.shape == (4, 2) and got.llama_state == b"\x02" * 10


def test_eviction_is_least_recently_used_over_capacity(make_cache):
    one = lc.state_size(state((0, 0), 100))  # 124 bytes for each two-token entry below
    cache = make_cache(3 * one)
    for tag, key in enumerate([(1, 1), (2, 2), (3, 3)], start=1):
        cache[key] = state(key, 100, tag)
    assert cache.cache_size == 3 * one and keys_of(cache) == [(1, 1), (2, 2), (3, 3)]
    assert cache[(1, 1, 5)].seed == 1  # a lookup makes (1, 1) the most recent
    cache[(4, 4)] = state((4, 4), 100, 4)
    assert keys_of(cache) == [(3, 3), (1, 1), (4, 4)] and cache.cache_size == 3 * one
    cache[(3, 3)] = state((3, 3), 100, 5)  # storing an existing key replaces it and makes it recent
    assert keys_of(cache) == [(1, 1), (4, 4), (3, 3)] and cache[(3, 3)].seed == 5
    cache[(6, 6)] = state((6, 6), 100 + 2 * one, 6)  # needs the room of all three others
    assert keys_of(cache) == [(6, 6)] and cache.cache_size == 3 * one
    cache[(7, 7)] = state((7, 7), 4 * one, 7)  # bigger than the capacity: evicted at once, as in llama-cpp-python
    assert keys_of(cache) == [] and cache.cache_size == 0
    with pytest.raises(KeyError):
        cache[(7, 7)]


def test_defaults_are_llama_cpp_pythons():
    assert lc.LlamaCache is lc.LlamaRAMCache
    assert lc.LlamaRAMCache().capacity_bytes == 2 << 30
    params = inspect.signature(lc.LlamaDiskCache).parameters
    assert (params["cache_dir"].default, params["capacity_bytes"].default) == (".cache/llama_cache", 2 << 30)
    assert issubclass(lc.LlamaDiskCache, lc.BaseLlamaCache) and issubclass(lc.LlamaRAMCache, lc.BaseLlamaCache)
    with pytest.raises(TypeError):
        lc.BaseLlamaCache()


def test_disk_cache_persists_and_survives_corruption(tmp_path):
    directory = str(tmp_path / "c")
    cache = lc.LlamaDiskCache(cache_dir=directory, capacity_bytes=1 << 20)
    cache[(1, 2, 3)] = state((1, 2, 3), 50, 1)
    cache[(1, 2)] = state((1, 2), 50, 2)
    cache[(5,)] = state((5,), 50, 3)
    again = lc.LlamaDiskCache(cache_dir=directory, capacity_bytes=1 << 20)
    assert again[(1, 2, 3, 4)].seed == 1 and len(again) == 3
    assert not [f for f in os.listdir(directory) if f.endswith(".tmp")]

    with open(cache._path((1, 2, 3), ".state"), "wb") as f:
        f.write(b"not a pickle")
    assert again[(1, 2, 3, 4)].seed == 2  # the corrupt entry is dropped: the next best prefix answers
    assert len(again) == 2 and (1, 2, 3) not in again._keys()

    with open(cache._path((5,), ".key"), "wb") as f:
        f.write(b"\x01\x02\x03")  # a torn key file
    assert (5, 5) not in again and len(again) == 1
    os.remove(cache._path((1, 2), ".state"))
    with pytest.raises(KeyError):
        again[(1, 2)]
    assert len(again) == 0
