"""The agent's shell sandbox: commands keep their effects, and a command that hangs, forks
without end, fills the disk, eats memory, reads outside its tree, opens a socket or prints
megabytes ends with a clear reason while the host and the run go on."""

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pearl.envs import sandbox as sandbox_module
from pearl.envs.sandbox import (
    CommandResult,
    Isolation,
    Sandbox,
    SandboxError,
    SandboxLimits,
    isolation,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox tests")

FAST = SandboxLimits(wall_s=3.0, processes=16)
# Sleeps this run starts last 900.<MARK> seconds: other test runs on the machine differ.
MARK = f"{os.getpid()}{time.monotonic_ns() % 10**6}"
NAP = f"sleep 900.{MARK}"


def needs(capability: str) -> None:
    """Skips the test, with the machine's own account, when it cannot enforce ``capability``."""
    if not getattr(isolation(), capability):
        pytest.skip(f"{capability} not enforced here: {isolation().text}")


def leftover(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (the command's processes, seen from
    outside any namespace)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read().replace(b"\0", b" "):
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture
def box():
    with Sandbox({"app.py": "print('hello from app')\n", "pkg/data.txt": "42\n"}, FAST) as sb:
        yield sb


# -- ordinary behaviour ------------------------------------------------------------------------
def test_commands_share_the_tree_and_report_exit_codes(box):
    first = box.run("echo edited > note.txt && mkdir -p out && echo done")
    assert first == CommandResult("done\n", 0, None, first.seconds)
    second = box.run("cat note.txt; ls out pkg; cat pkg/data.txt; exit 7")
    assert second.output == "edited\nout:\n\npkg:\ndata.txt\n42\n"
    assert second.returncode == 7 and second.stopped is None
    assert box.run("echo out; echo err >&2").output == "out\nerr\n"


def test_commands_run_in_the_tree_with_python_and_a_scrubbed_environment(box, monkeypatch):
    result = box.run("pwd; echo $HOME; python app.py; python3 -c 'import sys; print(sys.prefix)'")
    assert result.output.splitlines() == [box.cwd, box.cwd, "hello from app", sys.prefix]
    env = box.run("env").output
    assert "LANG=C.UTF-8" in env and "PYTEST_CURRENT_TEST" not in env and "PROXY" not in env.upper()


def test_host_side_files_round_trip_and_paths_that_escape_are_refused(box):
    box.write_file("tests/test_hidden.py", "def test_ok():\n    assert True\n")
    assert box.run("cat tests/test_hidden.py").output.startswith("def test_ok")
    box.run("echo agent > made.txt")
    assert box.read_file("made.txt") == "agent\n"
    assert (box.root / "made.txt").read_text() == "agent\n"
    box.write_file("big.txt", "y" * 300_000)  # larger than a pipe's buffer
    assert box.run("wc -c < big.txt").output == "300000\n"
    box.run("ln -s /etc/passwd link")
    for bad in ("../outside.txt", "/etc/passwd", "a/../../b", ""):
        with pytest.raises(ValueError, match="sandbox path"):
            box.write_file(bad, "x")
    with pytest.raises(ValueError, match="leaves"):
        box.read_file("link")
    with pytest.raises(FileNotFoundError):
        box.read_file("missing.txt")


def test_a_folder_is_copied_in_and_bad_inputs_are_refused(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("X = 1\n")
    with Sandbox(tmp_path, FAST) as sb:
        assert sb.run("python -c 'import src.m as m; print(m.X)'").output == "1\n"
        with pytest.raises(ValueError, match="timeout_s"):
            sb.run("true", timeout_s=0)
    with pytest.raises(ValueError, match="not a folder"):
        Sandbox(tmp_path / "missing", FAST)
    with pytest.raises(ValueError, match="leaves the tree"):
        Sandbox({"../x": "y"}, FAST)
    with pytest.raises(ValueError, match="wall_s"):
        SandboxLimits(wall_s=0)


def test_files_larger_than_disk_mb_are_refused():
    needs("disk_quota")
    with pytest.raises(ValueError, match="disk_mb=1"):
        Sandbox({"big.txt": "x" * 2 * 1024 * 1024}, SandboxLimits(disk_mb=1))


def test_close_kills_the_launcher_and_removes_everything():
    sb = Sandbox({"f": "x"}, FAST)
    base, pid = Path(sb._base), sb._launcher.process.pid
    assert base.exists()
    sb.close()
    sb.close()  # idempotent
    assert not base.exists() and not Path(f"/proc/{pid}").exists()
    with pytest.raises(SandboxError, match="closed"):
        sb.run("true")


@pytest.mark.parametrize("mode", ["namespaces", "plain"])
def test_close_from_another_thread_ends_a_running_command_cleanly(mode, monkeypatch):
    if mode == "plain":  # no pid namespace: the launcher itself must kill the command
        plain = Isolation(False, False, False, False, False, False, False, False, False, "plain")
        monkeypatch.setattr(sandbox_module, "isolation", lambda: plain)
    else:
        needs("whole_tree_kill")
    fds_before = sorted(os.listdir("/proc/self/fd"))
    sb = Sandbox({}, FAST)
    results: list[CommandResult] = []
    runner = threading.Thread(target=lambda: results.append(sb.run(NAP, timeout_s=30.0)))
    runner.start()
    deadline = time.monotonic() + 5.0
    while not leftover(NAP) and time.monotonic() < deadline:  # the command is running
        time.sleep(0.01)
    assert leftover(NAP)
    start = time.monotonic()
    sb.close()
    runner.join(timeout=5.0)
    assert not runner.is_alive() and time.monotonic() - start < 1.5
    assert results[0].stopped == "sandbox" and results[0].returncode is None, results
    assert "closed" in results[0].output
    assert leftover(NAP) == [] and not Path(sb._base).exists()
    assert sorted(os.listdir("/proc/self/fd")) == fds_before
    with pytest.raises(SandboxError, match="closed"):
        sb.run("true")


def test_run_is_safe_from_several_threads(box):
    results: list[CommandResult] = []
    threads = [
        threading.Thread(target=lambda k=k: results.append(box.run(f"echo {k} >> log; echo {k}")))
        for k in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.output for r in results) == ["0\n", "1\n", "2\n", "3\n"]
    assert sorted(box.read_file("log").split()) == ["0", "1", "2", "3"]


# -- what must be contained ----------------------------------------------------------------
@pytest.mark.parametrize(
    "command",
    [
        f"{NAP}",
        f"trap '' TERM; (trap '' TERM; {NAP}) & setsid {NAP} & {NAP}",
        f"{NAP} & echo started",  # outlives the shell, holding the output pipe
        f"setsid nohup {NAP} > /dev/null 2>&1 & {NAP}",
    ],
)
def test_a_command_that_hangs_is_stopped_at_wall_s_and_nothing_is_left(box, command):
    needs("whole_tree_kill")
    start = time.monotonic()
    result = box.run(command, timeout_s=1.0)
    assert result.stopped == "timeout" and result.returncode is None
    assert time.monotonic() - start < 3.0
    assert leftover(NAP) == []
    assert box.run("echo alive").output == "alive\n"


def test_a_background_process_does_not_outlive_its_command(box):
    needs("whole_tree_kill")
    result = box.run(f"setsid {NAP} > /dev/null 2>&1 < /dev/null & sleep 0.3; echo bye")
    assert result.output == "bye\n" and result.stopped is None
    assert leftover(NAP) == []


@pytest.mark.parametrize(
    "command",
    [
        ":(){ :|:& };:",
        "python -c 'import os, time\nwhile True:\n    try: os.fork()\n    except OSError: time.sleep(0.01)'",
    ],
)
def test_a_fork_bomb_is_stopped_for_processes(command):
    needs("process_limit")
    limits = SandboxLimits(wall_s=5.0, processes=16)
    with Sandbox({}, limits) as sb:
        start = time.monotonic()
        result = sb.run(command)
        assert result.stopped == "processes", result
        assert time.monotonic() - start < 4.0
        assert sb.run("echo still here").output == "still here\n"
        pid = sb._launcher.process.pid
        assert len(os.listdir(f"/proc/{pid}/task")) == 1  # the launcher itself, no strays


def test_filling_the_disk_stops_at_disk_mb_and_leaves_the_host_alone(tmp_path):
    needs("disk_quota")
    limits = SandboxLimits(wall_s=5.0, disk_mb=8, file_mb=64)
    with Sandbox({}, limits) as sb:
        result = sb.run("dd if=/dev/zero of=big bs=1M count=100")
        assert result.stopped == "disk", result
        size = os.statvfs(sb.root)
        assert size.f_blocks * size.f_frsize <= 8 * 1024 * 1024
        sb.run("rm big")
        many = sb.run("python -c \"\nfor i in range(10**6): open(f'f{i}', 'w').close()\"")
        assert many.stopped == "disk", many
        assert sb.run("rm -f f*; echo /tmp too > /tmp/x; cat /tmp/x").output == "/tmp too\n"


def test_a_file_over_file_mb_is_stopped_for_file_size():
    with Sandbox({}, SandboxLimits(wall_s=5.0, file_mb=1)) as sb:
        result = sb.run("yes > f")
        assert result.stopped == "file_size", result
        assert os.path.getsize(sb.root / "f") <= 1024 * 1024


def test_a_command_that_eats_memory_is_stopped_for_memory():
    limits = SandboxLimits(wall_s=5.0, memory_mb=256)
    with Sandbox({}, limits) as sb:
        once = sb.run("python -c 'x = bytearray(2 * 1024**3)'")
        assert once.stopped == "memory" and "MemoryError" in once.output, once
        slowly = sb.run("python -c 'a = []\nwhile True: a.append(b\"x\" * 10**7)'")
        assert slowly.stopped == "memory", slowly
        # Two processes under the per-process cap, together over it: the poll catches them.
        pair = sb.run(
            "for k in 1 2; do python -c 'import time; a = b\"x\" * 150 * 2**20; time.sleep(9)' & done; wait"
        )
        assert pair.stopped == "memory", pair
        assert sb.run("echo ok").output == "ok\n"


def host_shmem_mb() -> int:
    """The host's shared memory (tmpfs, memfd, SysV shm) in MB, from /proc/meminfo."""
    return int(Path("/proc/meminfo").read_text().split("Shmem:")[1].split()[0]) // 1024


MEMFDS = """
import mmap, os, sys, time
count, how = int(sys.argv[1]), sys.argv[2]
held = []
for i in range(count):
    fd = os.memfd_create(f"m{i}")
    os.posix_fallocate(fd, 0, 15 * 2**20)  # shmem: not in the RSS, not under RLIMIT_AS
    if how == "mapped":  # kept by an untouched mapping only: no fd, no RSS
        held.append(mmap.mmap(fd, 15 * 2**20))
    else:
        held.append(fd)
if how == "mapped":  # mmap keeps a dup of the fd: close every memfd fd, keep the mappings
    for fd in range(3, 64):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                os.close(fd)
        except OSError:
            pass
print("held MB", 15 * count, flush=True)
time.sleep(3)
"""

SYSV_SHM = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
count, keep = int(sys.argv[1]), sys.argv[2] == "keep"
for i in range(count):
    segment = libc.shmget(0, 50 * 2**20, 0o1000 | 0o600)
    if segment < 0:
        sys.exit(f"refused {ctypes.get_errno()}")
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 50 * 2**20)
    if not keep:  # detached, the segment would stay (not in any RSS) until removed
        libc.shmdt(ctypes.c_void_p(address))
print("made", count, flush=True)
time.sleep(2 if keep else 0)
"""


def test_memfd_memory_counts_against_memory_mb():
    with Sandbox({"memfds.py": MEMFDS}, SandboxLimits(wall_s=5.0, memory_mb=128)) as sb:
        before = host_shmem_mb()
        result = sb.run("python memfds.py 30 open")
        assert result.stopped == "memory" and "held MB" not in result.output, result
        assert host_shmem_mb() - before < 64  # the memfds died with the command
        # Each process under RLIMIT_AS, together 180 MB: the poll counts the mappings.
        mapped = sb.run("for k in 1 2 3; do python memfds.py 4 mapped & done; wait")
        assert mapped.stopped == "memory", mapped
        assert host_shmem_mb() - before < 64
        assert sb.run("echo ok").output == "ok\n"


def test_sysv_shared_memory_is_capped_and_gone_after_the_command():
    needs("shared_memory_limit")
    with Sandbox({"shm.py": SYSV_SHM}, SandboxLimits(wall_s=5.0, memory_mb=128)) as sb:
        before = host_shmem_mb()
        detached = sb.run("python shm.py 6 detach")  # 300 MB made, none attached at the end
        assert detached.stopped in (None, "memory"), detached
        assert host_shmem_mb() - before < 64  # no segment outlives the command
        assert sb.run("tail -n +2 /proc/sysvipc/shm | wc -l").output == "0\n"
        held = sb.run("for k in 1 2 3; do python shm.py 1 keep & done; wait")  # 150 MB at once
        assert held.stopped == "memory" or "refused" in held.output, held
        assert host_shmem_mb() - before < 64
        denied = sb.run("echo 1000000 > /proc/sys/kernel/shmall; cat /proc/sys/kernel/shmall")
        assert denied.output.splitlines()[-1] == str(128 * 2**20 // os.sysconf("SC_PAGE_SIZE"))


def test_cpu_time_is_limited():
    with Sandbox({}, SandboxLimits(wall_s=5.0, cpu_s=1)) as sb:
        result = sb.run("python -c 'while True: pass'")
        assert result.stopped == "cpu", result
        assert result.seconds < 4.0


def test_nothing_outside_the_tree_is_visible_or_writable(box, tmp_path):
    needs("writes_confined")
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    for command in (f"cat {secret}", "touch /usr/evil", "touch /evil", f"touch {tmp_path}/evil"):
        result = box.run(command)
        assert result.returncode != 0 and "host secret" not in result.output, (command, result)
    assert not (tmp_path / "evil").exists() and not Path("/usr/evil").exists()
    needs("filesystem_view")
    hostname = Path("/etc/hostname").read_text() if Path("/etc/hostname").exists() else "?"
    seen = box.run(f"cat /etc/hostname; ls /root; cat ../../{secret}; ls {tmp_path}")
    assert seen.returncode != 0 and seen.output.count("No such file or directory") == 3
    assert hostname.strip() not in seen.output and "host secret" not in seen.output


def test_sockets_cannot_reach_the_host_or_the_internet(box):
    needs("network")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    script = (
        "import socket\n"
        "for address in [('127.0.0.1', PORT), ('1.1.1.1', 80)]:\n"
        "    try:\n"
        "        socket.create_connection(address, timeout=1).close(); print('connected', address)\n"
        "    except OSError as e:\n"
        "        print('refused', address, e)\n"
    ).replace("PORT", str(port))
    box.write_file("net.py", script)
    result = box.run("python net.py")
    assert "connected" not in result.output and result.output.count("refused") == 2
    with pytest.raises(TimeoutError):
        server.accept()
    server.close()


def test_megabytes_of_output_are_truncated_with_a_note_and_do_not_block(box):
    result = box.run("yes | head -c 50M")
    assert result.stopped == "output" and result.seconds < 2.0, result.seconds
    assert len(result.output) < FAST.output_bytes + 200
    assert "bytes of output dropped" in result.output
    long = box.run("head -c 300000 /dev/zero | tr '\\0' a; echo; echo the end")
    assert long.stopped is None and long.returncode == 0
    assert long.output.startswith("a" * 1000) and long.output.endswith("the end\n")
    assert re.search(r"\[\.\.\. 2000\d\d bytes of output dropped \.\.\.\]", long.output)


def test_isolation_is_described_and_cached():
    first = isolation()
    assert first is isolation() and isinstance(first, Isolation)
    assert ("namespaces" in first.text) and len(first.text) > 100


def test_concurrent_first_calls_probe_isolation_once(monkeypatch):
    probes: list[int] = []
    gate = threading.Barrier(8)

    def probe() -> Isolation:
        probes.append(1)
        time.sleep(0.05)  # a real probe takes ~80 ms: the other threads arrive meanwhile
        return Isolation(False, False, False, False, False, False, False, False, False, "x")

    monkeypatch.setattr(sandbox_module, "_isolation", None)
    monkeypatch.setattr(sandbox_module, "_probe_isolation", probe)
    seen: list[Isolation] = []

    def first_use() -> None:
        gate.wait()
        seen.append(isolation())

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(probes) == 1 and len(seen) == 8 and all(s is seen[0] for s in seen)


def test_without_namespaces_the_plain_mode_still_limits_and_kills(monkeypatch, caplog):
    """The fallback a machine without namespaces gets: own host folder, rlimits, timeout,
    output cap, and the launcher's process tree killed (setsid included, via subreaping)."""
    root = os.getuid() == 0
    plain = Isolation(False, False, False, False, False, False, root, root, False, "plain")
    monkeypatch.setattr(sandbox_module, "isolation", lambda: plain)
    monkeypatch.setattr(Sandbox, "_warned", False)
    with Sandbox({"a.txt": "a\n"}, FAST) as sb:
        assert sb.cwd == str(sb.root) and sb.run("cat a.txt; echo b > b.txt").output == "a\n"
        assert sb.read_file("b.txt") == "b\n"
        result = sb.run(f"setsid {NAP} & {NAP}", timeout_s=1.0)
        assert result.stopped == "timeout" and leftover(NAP) == []
        assert sb.run("yes | head -c 50M").stopped == "output"
        if os.getuid() == 0:  # the commands' own uid: no writes outside, per-sandbox NPROC
            assert sb.run("touch /usr/evil").returncode != 0
            assert sb.run(":(){ :|:& };:").stopped == "processes"
        root = sb.root
        with Sandbox({}, FAST):
            pass
    assert not root.exists()
    warnings = [r.message for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "partial" in warnings[0]


@pytest.mark.skipif(not isolation().filesystem_view, reason="no filesystem view on this machine")
def test_a_python_installed_under_tmp_runs_in_the_sandbox(tmp_path):
    """The sandbox mounts a tmpfs over /tmp; a PEARL venv under /tmp (a clone there) must
    still be what `python` runs inside, not hidden by it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    src = Path(__file__).resolve().parents[2] / "src"
    script = (
        "from pearl.envs.sandbox import Sandbox\n"
        "with Sandbox({'a.py': 'print(6 * 7)'}) as box:\n"
        "    r = box.run('command -v python; python a.py')\n"
        "print(r.returncode, r.output)\n"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:3] == ["0", str(venv / "bin" / "python"), "42"], done.stdout
