"""A session's KV file (``pearl.live.vllm_session_kv``): rows by token, added and dropped at
the end, read by range. No vLLM needed: the server and the connector share this code."""

import numpy as np
import pytest

from pearl.errors import KVTransferError
from pearl.live.vllm_session_kv import SessionKV, read_rows, write_rows

GEOMETRY = (3, 2, 4)  # layers, kv_heads, head_dim


def _kv(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (GEOMETRY[0], n, *GEOMETRY[1:])
    return rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(
        shape, dtype=np.float32
    )


def test_appended_chunks_read_back_by_any_token_range(tmp_path):
    kv = SessionKV(str(tmp_path / "s.kv"), GEOMETRY, [], 0)
    k1, v1 = _kv(5, 1)
    k2, v2 = _kv(3, 2)
    kv.append([1, 2, 3, 4, 5], k1, v1)
    kv.append([6, 7, 8], k2, v2)
    assert kv.token_ids == [1, 2, 3, 4, 5, 6, 7, 8] and kv.saved() == 8
    keys, values = kv.read(3, 7)  # across both chunks
    assert np.array_equal(keys, np.concatenate([k1, k2], axis=1)[:, 3:7])
    assert np.array_equal(values, np.concatenate([v1, v2], axis=1)[:, 3:7])
    assert keys.flags.c_contiguous and keys.shape == (3, 4, 2, 4)


def test_truncating_drops_the_tail_and_the_next_rows_replace_it(tmp_path):
    kv = SessionKV(str(tmp_path / "s.kv"), GEOMETRY, [], 0)
    k1, v1 = _kv(6, 1)
    kv.append(list(range(6)), k1, v1)
    assert kv.matched([0, 1, 2, 9, 9]) == 3
    kv.truncate(3)
    assert kv.token_ids == [0, 1, 2] and kv.saved() == 3
    k2, v2 = _kv(2, 2)
    kv.append([9, 9], k2, v2)
    keys, _ = kv.read(0, 5)
    assert np.array_equal(keys[:, :3], k1[:, :3]) and np.array_equal(keys[:, 3:], k2)
    with pytest.raises(KVTransferError, match=r"holds 5 tokens of KV, not tokens \[2, 6\)"):
        kv.read(2, 6)
    kv.remove()
    assert kv.saved() == 0


def test_rows_written_from_a_token_replace_the_rest_of_the_file(tmp_path):
    """What the connector does for a prompt that extends the session's last one: rows from
    the shared prefix on, the file ending after them."""
    path = str(tmp_path / "p.kv")
    row = (GEOMETRY[0], 2, *GEOMETRY[1:])
    first = np.arange(10 * np.prod(row), dtype=np.float32).reshape(10, *row)
    write_rows(path, 0, first)
    second = -np.ones((2, *row), dtype=np.float32)
    write_rows(path, 4, second)  # tokens 4 and 5 differ; the old 6..9 are gone
    rows = read_rows(path, 0, 6, row)
    assert np.array_equal(rows[:4], first[:4]) and np.array_equal(rows[4:], second)
    with pytest.raises(KVTransferError):
        read_rows(path, 0, 7, row)


def test_kv_files_go_to_shared_memory_only_where_it_has_room(tmp_path, monkeypatch):
    """Containers often mount a 64 MB /dev/shm: too small for sessions' KV or a model's
    weights in transit, so the server falls back to the temporary directory."""
    import shutil
    import tempfile
    from collections import namedtuple

    from pearl.live import vllm_server

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(64 << 20, 0, 64 << 20))
    assert vllm_server._shared_dir(str(tmp_path)) == tempfile.gettempdir()
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(32 << 30, 0, 16 << 30))
    assert vllm_server._shared_dir(str(tmp_path)) == str(tmp_path)
    assert vllm_server._shared_dir(str(tmp_path / "absent")) == tempfile.gettempdir()


def test_writing_no_rows_from_a_token_ends_the_file_there(tmp_path):
    path = str(tmp_path / "p.kv")
    row = (GEOMETRY[0], 2, *GEOMETRY[1:])
    write_rows(path, 0, np.ones((4, *row), dtype=np.float32))
    write_rows(path, 3, np.ones((0, *row), dtype=np.float32))  # was: the whole file wiped
    assert read_rows(path, 0, 3, row).shape == (3, *row)
    with pytest.raises(KVTransferError):
        read_rows(path, 0, 4, row)
