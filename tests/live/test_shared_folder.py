"""The vLLM servers' folders in shared memory (pearl.live.shared_folder): a new server
removes the folders of servers that are gone and keeps those of live ones, wherever they
run, even in another PID namespace sharing /dev/shm (Docker --ipc=host)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pearl.live.shared_folder import LOCK_FILE, UNLOCKED_IDLE_S
from pearl.live.vllm_server import _kv_folder

# A vLLM server's folder, held by a process of its own until the test closes its stdin;
# then it ends without removing the folder, as a killed worker does.
OWNER = """
import os, sys
from pearl.live.shared_folder import OwnedFolder
folder = OwnedFolder.create(sys.argv[1], "pearl-kv-", "w0")
with open(os.path.join(folder.path, "0.kv"), "wb") as f:
    f.write(b"a session's KV")
print(folder.path, flush=True)
sys.stdin.read()
os._exit(0)
"""


def _visible(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _gone_pid() -> int:
    """The id of a process that has ended."""
    run = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(run.stdout)


def _start_owner(command: list[str]) -> tuple[subprocess.Popen[str], Path]:
    owner = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    line = owner.stdout.readline().strip()
    if not line:
        owner.kill()
        _, err = owner.communicate(timeout=30)
        pytest.skip(f"the owner process did not start: {err.strip()[-300:]}")
    return owner, Path(line)


def _end(owner: subprocess.Popen[str]) -> None:
    owner.communicate(input="", timeout=60)  # closes its stdin: it ends, leaving its folder


def test_a_live_servers_kv_folder_in_another_pid_namespace_is_kept(tmp_path):
    """The owner runs in a PID namespace of its own with an id no process has here, as a
    worker in another container sharing /dev/shm: its folder stays while it lives, and
    goes once it has ended."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    pid = next(p for p in range(pid_max - 1, 1000, -1) if not _visible(p))
    # In the new namespace: its next process gets id `pid` (ns_last_pid), and is the owner.
    script = 'echo "$1" > /proc/sys/kernel/ns_last_pid && "$2" -c "$3" "$4"; :'
    owner, live = _start_owner(
        ["unshare", "--pid", "--fork", "sh", "-c", script]
        + ["sh", str(pid - 1), sys.executable, OWNER, str(tmp_path)]
    )
    try:
        assert live.name.startswith(f"pearl-kv-{pid}-w0-")
        assert not _visible(pid)  # its id names no process here
        mine = _kv_folder("w1", str(tmp_path))
        assert (live / "0.kv").read_bytes() == b"a session's KV"
    finally:
        _end(owner)
    again = _kv_folder("w2", str(tmp_path))
    assert not live.exists()  # its owner has ended: its lock is free
    assert os.path.isdir(mine.path)  # this process still holds it
    mine.remove()
    again.remove()
    assert sorted(tmp_path.iterdir()) == []


def test_a_live_servers_kv_folder_whose_process_is_not_visible_is_kept(tmp_path):
    """Where unshare is not available: a live owner's folder renamed to carry the id of a
    process that has ended (what another PID namespace looks like from here)."""
    owner, folder = _start_owner([sys.executable, "-c", OWNER, str(tmp_path)])
    try:
        live = folder.with_name(folder.name.replace(f"-{owner.pid}-", f"-{_gone_pid()}-", 1))
        folder.rename(live)
        mine = _kv_folder("w1", str(tmp_path))
        assert (live / "0.kv").read_bytes() == b"a session's KV"
    finally:
        _end(owner)
    _kv_folder("w2", str(tmp_path)).remove()
    assert not live.exists()
    mine.remove()


def test_kv_folders_without_a_lock_go_only_when_their_process_is_gone_and_a_day_passed(
    tmp_path,
):
    """Folders of servers before owners held locks: the process id alone is no proof (it
    may run in another PID namespace), so only a folder also untouched for a day goes."""
    gone = _gone_pid()
    stale = tmp_path / f"pearl-kv-{gone}-w0-abc"  # a killed worker's, a day ago
    recent = tmp_path / f"pearl-kv-{gone}-w1-def"  # may be a live one's, elsewhere
    visible = tmp_path / f"pearl-kv-{os.getpid()}-w2-ghi"  # its process is here
    unnamed = tmp_path / "pearl-kv-w3-jkl"  # not named by a process: not ours to judge
    for folder in (stale, recent, visible, unnamed):
        folder.mkdir()
        (folder / "0.kv").write_bytes(b"kv")
    day_ago = os.stat(tmp_path).st_mtime - UNLOCKED_IDLE_S - 60
    for folder in (stale, visible, unnamed):
        os.utime(folder / "0.kv", (day_ago, day_ago))
        os.utime(folder, (day_ago, day_ago))
    made = _kv_folder("w4", str(tmp_path))
    assert not stale.exists()
    assert recent.exists() and visible.exists() and unnamed.exists()
    assert os.path.basename(made.path).startswith(f"pearl-kv-{os.getpid()}-w4-")
    assert os.path.isfile(os.path.join(made.path, LOCK_FILE))
    made.remove()
    assert not os.path.exists(made.path)


def test_a_vllm_server_that_fails_to_start_leaves_no_folder(tmp_path, monkeypatch):
    """vLLM's engine fails to start (out of GPU memory, a bad model): the server's folder,
    made for it just before, is removed with the failure, not kept locked for as long as
    the process lives. (vLLM is not needed: a stand-in engine that fails to start.)"""
    import json
    import types

    from pearl.engine.config import EngineConfig
    from pearl.live import vllm_server
    from pearl.live.server import ModelSpec

    class FailingEngine:
        @classmethod
        def from_engine_args(cls, args, stat_loggers=None):
            cls.started_in = os.environ["VLLM_RPC_BASE_PATH"]
            assert os.path.isdir(cls.started_in)
            raise RuntimeError("CUDA out of memory")

    stand_in = types.ModuleType("vllm.v1.engine.async_llm")
    stand_in.AsyncLLM = FailingEngine  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.v1", "vllm.v1.engine"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.async_llm", stand_in)
    monkeypatch.setattr(vllm_server, "engine_args", lambda folder, config: object())
    monkeypatch.setattr(vllm_server, "_shared_dir", lambda *where: str(tmp_path))
    model = tmp_path / "model"
    model.mkdir()
    geometry = {"num_attention_heads": 2, "hidden_size": 64, "num_hidden_layers": 2}
    (model / "config.json").write_text(json.dumps(geometry))
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        vllm_server.VllmServer("w0", ModelSpec(folder=str(model)), EngineConfig())
    assert FailingEngine.started_in.startswith(str(tmp_path / "pearl-kv-"))
    assert not list(tmp_path.glob("pearl-kv-*"))
