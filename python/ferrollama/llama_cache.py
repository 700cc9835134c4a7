"""llama-cpp-python's ``llama_cpp.llama_cache``: saved context states looked up by token prefix.

Keys are token sequences; a lookup returns the state stored under the key that shares the longest
prefix with the asked one (KeyError when none shares a token), and the Llama reloads it and
evaluates only the rest. Entries past ``capacity_bytes`` are evicted least recently used first;
an entry is sized by its ``llama_state_size`` plus the bytes of its ``input_ids`` and ``scores``.

Deliberate differences from llama-cpp-python 0.3.36: ``LlamaDiskCache`` needs no ``diskcache``
package (entries are files in ``cache_dir``), keeps an entry it serves (theirs pops it, so a
state is served once) and evicts least recently used, as the RAM cache does.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import struct
import tempfile
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .generation.tokens import common_prefix_len

__all__ = ["BaseLlamaCache", "LlamaRAMCache", "LlamaCache", "LlamaDiskCache"]

DEFAULT_CAPACITY_BYTES = 2 << 30


def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share."""
    return common_prefix_len(a, b)


def state_size(state: Any) -> int:
    """The bytes a LlamaState holds: the context's state plus its token and score arrays."""
    size = int(state.llama_state_size)
    for field in ("input_ids", "scores"):
        array = getattr(state, field, None)
        if array is not None:
            size += np.asarray(array).nbytes
    return size


def _best_prefix_key(keys: Iterable[Tuple[int, ...]], key: Sequence[int]) -> Optional[Tuple[int, ...]]:
    """The key sharing the longest prefix with ``key`` (the first such on ties), or None if none shares one."""
    best, best_len = None, 0
    for k in keys:
        n = longest_token_prefix(k, key)
        if n > best_len:
            best, best_len = k, n
    return best


class BaseLlamaCache(ABC):
    """A cache of context states keyed by token sequences."""

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY_BYTES):
        self.capacity_bytes = capacity_bytes

    @property
    @abstractmethod
    def cache_size(self) -> int:
        """The bytes the cached states hold."""

    def _find_longest_prefix_key(self, key: Tuple[int, ...]) -> Optional[Tuple[int, ...]]:
        return _best_prefix_key(self._keys(), key)

    @abstractmethod
    def _keys(self) -> List[Tuple[int, ...]]:
        """The stored keys, least recently used first."""

    @abstractmethod
    def __getitem__(self, key: Sequence[int]) -> Any:
        """The state stored under the key with the longest common prefix; KeyError if none."""

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_longest_prefix_key(tuple(key)) is not None

    @abstractmethod
    def __setitem__(self, key: Sequence[int], value: Any) -> None:
        """Store a state, then evict least recently used entries while over capacity."""


class LlamaRAMCache(BaseLlamaCache):
    """States held in memory."""

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY_BYTES):
        super().__init__(capacity_bytes)
        self.cache_state: "OrderedDict[Tuple[int, ...], Any]" = OrderedDict()  # least recently used first

    @property
    def cache_size(self) -> int:
        return sum(state_size(s) for s in self.cache_state.values())

    def _keys(self) -> List[Tuple[int, ...]]:
        return list(self.cache_state)

    def __len__(self) -> int:
        return len(self.cache_state)

    def __getitem__(self, key: Sequence[int]) -> Any:
        found = self._find_longest_prefix_key(tuple(key))
        if found is None:
            raise KeyError("Key not found")
        self.cache_state.move_to_end(found)
        return self.cache_state[found]

    def __setitem__(self, key: Sequence[int], value: Any) -> None:
        key = tuple(int(t) for t in key)
        self.cache_state.pop(key, None)
        self.cache_state[key] = value
        while self.cache_state and self.cache_size > self.capacity_bytes:
            self.cache_state.popitem(last=False)


LlamaCache = LlamaRAMCache  # llama-cpp-python's older name


# An entry of the disk cache is two files named by the key's digest: ``.state`` (the pickled state)
# and ``.key`` (the state's size as u64, then the tokens as i32, little-endian). The key file is
# written last, so its presence marks a complete entry; its mtime orders entries by recency.
_KEY_HEADER = struct.Struct("<Q")


class LlamaDiskCache(BaseLlamaCache):
    """States held as files in ``cache_dir`` (pickled: only use a directory you trust, as with diskcache)."""

    def __init__(self, cache_dir: str = ".cache/llama_cache", capacity_bytes: int = DEFAULT_CAPACITY_BYTES):
        super().__init__(capacity_bytes)
        self.cache_dir = os.fspath(cache_dir)
        os.makedirs(self.cache_dir, exist_ok=True)

    # --- the entries on disk ---

    def _path(self, key: Tuple[int, ...], suffix: str) -> str:
        digest = hashlib.sha256(np.asarray(key, dtype="<i4").tobytes()).hexdigest()[:40]
        return os.path.join(self.cache_dir, digest + suffix)

    def _entries(self) -> List[Tuple[int, Tuple[int, ...], int]]:
        """(mtime_ns, key, size) of every readable entry, least recently used first."""
        entries = []
        for name in os.listdir(self.cache_dir):
            if not name.endswith(".key"):
                continue
            path = os.path.join(self.cache_dir, name)
            try:
                with open(path, "rb") as f:
                    data = f.read()
                mtime = os.stat(path).st_mtime_ns
            except OSError:
                continue  # removed meanwhile
            parsed = _parse_key_file(data)
            if parsed is None:
                self._remove_file(path)  # a torn or foreign file: not an entry
                continue
            size, key = parsed
            entries.append((mtime, key, size))
        entries.sort()
        return entries

    def _keys(self) -> List[Tuple[int, ...]]:
        return [key for _, key, _ in self._entries()]

    @property
    def cache_size(self) -> int:
        return sum(size for _, _, size in self._entries())

    def __len__(self) -> int:
        return len(self._entries())

    def _remove(self, key: Tuple[int, ...]) -> None:
        self._remove_file(self._path(key, ".key"))
        self._remove_file(self._path(key, ".state"))

    @staticmethod
    def _remove_file(path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass

    def _touch(self, key: Tuple[int, ...]) -> None:
        """Mark an entry most recently used: an mtime past every other entry's."""
        newest = max((mtime for mtime, _, _ in self._entries()), default=0)
        stamp = max(time.time_ns(), newest + 1)
        os.utime(self._path(key, ".key"), ns=(stamp, stamp))

    def _write_atomically(self, path: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.cache_dir, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            self._remove_file(tmp)
            raise

    # --- the mapping ---

    def __getitem__(self, key: Sequence[int]) -> Any:
        key = tuple(key)
        while True:
            found = self._find_longest_prefix_key(key)
            if found is None:
                raise KeyError("Key not found")
            try:
                with open(self._path(found, ".state"), "rb") as f:
                    value = pickle.load(f)
            except Exception:  # unreadable or corrupt: drop the entry and look again
                self._remove(found)
                continue
            self._touch(found)
            return value

    def __setitem__(self, key: Sequence[int], value: Any) -> None:
        key = tuple(int(t) for t in key)
        self._remove(key)
        self._write_atomically(self._path(key, ".state"), pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        header = _KEY_HEADER.pack(state_size(value))
        self._write_atomically(self._path(key, ".key"), header + np.asarray(key, dtype="<i4").tobytes())
        self._touch(key)
        entries = self._entries()
        total = sum(size for _, _, size in entries)
        for _, old_key, size in entries:  # least recently used first
            if total <= self.capacity_bytes:
                break
            self._remove(old_key)
            total -= size


def _parse_key_file(data: bytes) -> Optional[Tuple[int, Tuple[int, ...]]]:
    if len(data) < _KEY_HEADER.size or (len(data) - _KEY_HEADER.size) % 4:
        return None
    (size,) = _KEY_HEADER.unpack_from(data)
    tokens = np.frombuffer(data, dtype="<i4", offset=_KEY_HEADER.size)
    return size, tuple(int(t) for t in tokens)
