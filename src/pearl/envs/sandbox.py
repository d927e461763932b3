"""A sandbox for an agent's shell commands: one per episode, its own copy of a work tree,
``bash -c CMD`` run in it under limits (docs/sandbox.md).

A command that hangs, forks without end, fills the disk, eats memory, reads outside its
tree, opens a socket or prints megabytes ends with a ``CommandResult.stopped`` reason; the
run goes on and the host is unharmed, to the extent ``isolation()`` says this machine
enforces. The work happens in a launcher process per sandbox (``sandbox_shell.py``, started
as a plain script): it owns the namespaces and the command's processes, so the trainer
(multithreaded) never forks with namespace syscalls or ``preexec_fn``.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("sandbox_shell.py")
STARTUP_S = 15.0  # the launcher builds its root and copies the files in this time, or fails
SLACK_S = 5.0  # a command's answer may come this long after its wall limit
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(slots=True, frozen=True)
class SandboxLimits:
    """Limits of one sandbox; the per-command ones apply afresh to each ``run``."""

    wall_s: float = 30.0  # per command, wall clock
    cpu_s: int = 30  # per command process, RLIMIT_CPU
    memory_mb: int = 1024  # per process address space (RLIMIT_AS); all processes' RSS + shm
    file_mb: int = 16  # largest file a command may write (RLIMIT_FSIZE)
    disk_mb: int = 64  # the whole tree's size (with /tmp, when namespaced)
    processes: int = 64  # processes/threads at once
    output_bytes: int = 100_000  # stdout+stderr kept per command (rest dropped, said so)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}")
        if self.output_bytes < 2:
            raise ValueError(
                f"SandboxLimits.output_bytes must be at least 2, got {self.output_bytes}"
            )


@dataclass(slots=True, frozen=True)
class CommandResult:
    """What one command did. ``stopped`` names the limit that ended it ("timeout",
    "output", "cpu", "memory", "file_size", "disk", "processes", "sandbox" when the launcher
    itself failed) or is None; ``returncode`` is None when the sandbox stopped it."""

    output: str  # stdout and stderr interleaved, truncated to output_bytes with a note
    returncode: int | None
    stopped: str | None
    seconds: float


@dataclass(slots=True, frozen=True)
class Isolation:
    """What this machine enforces for a sandbox (``isolation()``); ``text`` says it in words,
    with what is missing and what would enable it."""

    namespaces: bool  # own mount/pid/net/IPC/UTS namespaces
    user_namespace: bool  # namespaces came through an unprivileged user namespace
    filesystem_view: bool  # commands see only the tree and read-only system dirs
    network: bool  # no network reachable (empty network namespace)
    whole_tree_kill: bool  # every process of a command is killed, setsid or not
    disk_quota: bool  # disk_mb is a hard filesystem limit (else checked after each command)
    process_limit: bool  # RLIMIT_NPROC counts this sandbox's processes only
    writes_confined: bool  # writes outside the tree fail
    shared_memory_limit: bool  # SysV shm in the sandbox totals at most memory_mb (IPC sysctls)
    text: str


class SandboxError(RuntimeError):
    """The sandbox itself could not start or answer (not something a command did)."""


def _launcher_argv() -> list[str]:
    # -I: no user site, PYTHON* variables or cwd on sys.path; -S: no site (fast, and the
    # launcher needs only the standard library).
    return [sys.executable, "-I", "-S", str(LAUNCHER)]


def _python_dirs() -> list[str]:
    """Folders the sandbox needs for PEARL's Python to run inside it."""
    exe = os.path.realpath(sys.executable)
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    dirs.add(str(Path(exe).parent.parent))
    return sorted(d for d in dirs if d and d != "/")


def _command_path() -> str:
    """PATH for commands: the Python that runs PEARL first (``python``, ``python3``)."""
    return f"{Path(sys.executable).parent}:{SYSTEM_PATH}"


class _Launcher:
    """The launcher process and its JSON-lines pipes, with deadlines on every answer."""

    def __init__(self, config: dict) -> None:
        self.process = subprocess.Popen(
            _launcher_argv(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,  # requests go out whole at once, nothing is left buffered at a kill
            env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"},
            start_new_session=True,  # the terminal's Ctrl-C is the trainer's, not the sandbox's
            close_fds=True,
        )
        self.buffer = b""
        self.send(config)

    def send(self, message: dict) -> None:
        assert self.process.stdin is not None
        data = memoryview((json.dumps(message) + "\n").encode())
        while data:  # unbuffered: one write may take part of a large request
            data = data[self.process.stdin.write(data) or 0 :]

    def receive(self, timeout_s: float) -> dict | None:
        """The next answer, or None when the launcher is gone or late."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return None
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def stop(self) -> None:
        """Ends the launcher without touching its pipes (another thread may be reading them):
        SIGTERM (a plain-mode launcher then kills its command's processes), SIGKILL soon."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        # The namespace's init dies with it (PDEATHSIG), and the kernel then kills the rest.
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:  # a request the dead launcher never read
                pass


def _shut(launcher: _Launcher, base: str) -> None:
    """Ends a sandbox: asks the launcher to exit, kills it if it does not, removes the files."""
    try:
        if launcher.process.poll() is None:
            launcher.send({"exit": True})
            launcher.process.wait(timeout=2.0)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    try:
        launcher.kill()
    finally:
        shutil.rmtree(base, ignore_errors=True)


_isolation: Isolation | None = None
_isolation_lock = threading.Lock()


def isolation() -> Isolation:
    """What this machine enforces, found once per process by starting a namespaced launcher
    (so seccomp or a sysctl that forbids namespaces is seen, not guessed); thread-safe."""
    global _isolation
    if _isolation is None:
        with _isolation_lock:  # concurrent first calls: one probe, the others wait for it
            if _isolation is None:
                _isolation = _probe_isolation()
    return _isolation


def _probe_isolation() -> Isolation:
    """Starts one namespaced launcher and reads off what this machine enforces."""
    linux = sys.platform.startswith("linux")
    result, reason = _probe_launcher() if linux else (None, "this is not Linux")
    ns = bool(result and result.get("ready"))
    root = os.geteuid() == 0 if hasattr(os, "geteuid") else False
    user_ns = ns and bool(result and result.get("user_namespace"))
    shm_limit = ns and bool(result and result.get("ipc_limited"))
    text = _namespaced_text(user_ns, shm_limit) if ns else _unisolated_text(reason, root)
    return Isolation(
        namespaces=ns,
        user_namespace=user_ns,
        filesystem_view=ns,
        network=ns,
        whole_tree_kill=ns,
        disk_quota=ns,
        process_limit=linux and (ns or root),
        writes_confined=ns or (linux and root),
        shared_memory_limit=shm_limit,
        text=text,
    )


def _probe_launcher() -> tuple[dict | None, str]:
    """A namespaced launcher's first answer (None when it gave none) and the error it gave."""
    base = tempfile.mkdtemp(prefix="pearl-sandbox-probe-")
    os.mkdir(f"{base}/root")
    os.mkdir(f"{base}/files")
    launcher = _Launcher(_config("namespaces", base, SandboxLimits()))
    try:
        result = launcher.receive(STARTUP_S)
    finally:
        _shut(launcher, base)
    return result, (result or {}).get("error", "the launcher did not answer")


def _namespaced_text(user_ns: bool, shm_limit: bool) -> str:
    """``Isolation.text`` where the launcher made its namespaces."""
    how = "an unprivileged user namespace" if user_ns else "root"
    sysv = (
        "SysV shm is capped at memory_mb by the IPC namespace's shmall/shmmax"
        if shm_limit
        else "SysV shm is not capped (the IPC namespace's shm sysctls could not be set)"
    )
    return (
        f"Sandboxes are isolated with namespaces (through {how}): each command sees only "
        "its tree and read-only system folders, has no network, runs under rlimits, and "
        "every one of its processes is killed when it ends; the tree, /tmp and /dev/shm "
        "share one tmpfs of disk_mb. Memory (no cgroups): RLIMIT_AS per process, and a "
        "50 ms poll that stops a command once its processes' private and file-backed "
        "resident pages plus the memfds and shared mappings they hold plus the SysV shm "
        "segments exceed memory_mb; "
        f"{sysv}, and SysV IPC objects are removed after each command. Not enforced: "
        "memory between two polls, and CPU across processes (polled likewise)."
    )


def _unisolated_text(reason: str, root: bool) -> str:
    """``Isolation.text`` without namespaces: why, what is missing, what would enable it."""
    missing = (
        "Not enforced here: a private filesystem view (commands can read the whole host), "
        "network isolation (commands can open sockets), a hard disk quota (the tree's size "
        "is checked after each command; RLIMIT_FSIZE bounds each file), and killing "
        "processes that escape the launcher's process tree."
    )
    if not root:
        missing += " Writes outside the tree are not prevented (commands run as this user)."
    enable = (
        "Linux with unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1"
        ", and no seccomp/AppArmor rule forbidding unshare) or running as root would enable"
        " them."
    )
    return f"Sandboxes cannot make namespaces ({reason}). {missing} {enable}"


def _config(mode: str, base: str, limits: SandboxLimits) -> dict:
    return {
        "mode": mode,
        "tree": f"{base}/root",
        "files": f"{base}/files",
        "limits": asdict(limits),
        "python_dirs": _python_dirs(),
        "path": _command_path(),
    }


def _relative(path: str) -> str:
    """``path`` as a relative path inside the tree, or ValueError."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ValueError(f"sandbox path must be a non-empty string without NUL, got {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        raise ValueError(
            f"sandbox path {path!r} leaves the tree: give a relative path without '..'"
        )
    return str(pure)


class Sandbox:
    """One episode's tree and the shell commands run in it (thread-safe: one command at a
    time). ``files`` is a mapping of relative path -> text, or a folder copied in."""

    _warned = False
    _warn_lock = threading.Lock()

    def __init__(
        self, files: Mapping[str, str] | Path, limits: SandboxLimits = SandboxLimits()
    ) -> None:
        self.limits = limits
        self.isolation = isolation()
        self._lock = threading.Lock()
        self._closed = False
        self._lost: str | None = None
        self._warn_once()
        base = tempfile.mkdtemp(prefix="pearl-sandbox-")
        self._base = base
        try:
            os.chmod(base, 0o711)  # the commands' own uid must reach base/root (plain mode)
            os.mkdir(f"{base}/root", 0o755)
            _stage(files, Path(f"{base}/files"))
            mode = "namespaces" if self.isolation.namespaces else "plain"
            self._launcher = _Launcher(_config(mode, base, limits))
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise
        self._finalizer = weakref.finalize(self, _shut, self._launcher, base)
        ready = self._launcher.receive(STARTUP_S)
        shutil.rmtree(f"{base}/files", ignore_errors=True)
        if not ready or not ready.get("ready"):
            self.close()
            error = (ready or {}).get("error", "the launcher did not answer")
            if "No space left" in error:
                raise ValueError(f"the sandbox's files do not fit in disk_mb={limits.disk_mb}")
            raise SandboxError(f"sandbox did not start: {error}")
        self._inside_tree = ready["tree"]

    @classmethod
    def _warn_once(cls) -> None:
        """Says once per process what this machine cannot enforce (a warning when commands
        could reach the host's files or network)."""
        with cls._warn_lock:
            if cls._warned:
                return
            cls._warned = True
        iso = isolation()
        if iso.namespaces:
            log.info("sandbox isolation: %s", iso.text)
        else:
            log.warning("sandbox isolation is partial on this machine: %s", iso.text)

    @property
    def root(self) -> Path:
        """The host path of the tree (inside the launcher's mount namespace, reached through
        /proc when namespaced)."""
        if self.isolation.namespaces:
            return Path(f"/proc/{self._launcher.process.pid}/root{self._inside_tree}")
        return Path(self._inside_tree)

    @property
    def cwd(self) -> str:
        """Where commands run, as they see it ("/repo" when namespaced)."""
        return self._inside_tree

    def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        """Runs ``bash -c command`` in the tree and waits for it; never raises for anything
        the command does. ``timeout_s`` replaces ``limits.wall_s`` for this command (a
        hidden test suite may need longer than the agent's commands get)."""
        if not isinstance(command, str) or "\x00" in command:
            raise ValueError(f"command must be a string without NUL bytes, got {command!r:.80}")
        wall = self.limits.wall_s if timeout_s is None else float(timeout_s)
        if not wall > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        start = time.monotonic()
        with self._lock:
            answer = self._ask({"command": command, "wall_s": wall}, wall + SLACK_S)
        if answer is None or "output" not in answer:
            return CommandResult(
                output=f"[sandbox failed: {self._lost or answer}]",
                returncode=None,
                stopped="sandbox",
                seconds=time.monotonic() - start,
            )
        return CommandResult(
            output=answer["output"],
            returncode=answer["returncode"],
            stopped=answer["stopped"],
            seconds=answer["seconds"],
        )

    def write_file(self, path: str, text: str) -> None:
        """Writes ``text`` at ``path`` (relative, inside the tree), owned by the commands' user."""
        relative = _relative(path)
        with self._lock:
            self._file_answer(self._ask({"write": relative, "text": text}, STARTUP_S), path)

    def read_file(self, path: str) -> str:
        """The text at ``path`` (relative, inside the tree; a symlink out of it is refused)."""
        relative = _relative(path)
        with self._lock:
            return self._file_answer(self._ask({"read": relative}, STARTUP_S), path)["text"]

    def _file_answer(self, answer: dict | None, path: str) -> dict:
        if answer is None:
            raise SandboxError(f"sandbox failed: {self._lost}")
        if "error" in answer:
            error = answer["error"]
            if error.startswith(("FileNotFoundError", "IsADirectoryError", "NotADirectoryError")):
                raise FileNotFoundError(f"sandbox path {path!r}: {error}")
            raise ValueError(f"sandbox path {path!r}: {error}")
        return answer

    def _ask(self, request: dict, timeout_s: float) -> dict | None:
        """One request and its answer; a launcher that is gone or late is killed and the
        sandbox is lost (every later request answers None)."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if self._lost:
            return None
        try:
            self._launcher.send(request)
            answer = self._launcher.receive(timeout_s)
        except (OSError, ValueError) as e:
            answer, self._lost = None, f"launcher pipe broke: {e}"
        if answer is None:
            if self._closed:  # close() from another thread ended the launcher
                self._lost = "the sandbox was closed while the request ran"
            self._lost = self._lost or f"the launcher did not answer within {timeout_s:.0f} s"
            self._launcher.kill()
        return answer

    def close(self) -> None:
        """Kills anything left and removes the tree; idempotent and safe from any thread. A
        request in flight in another thread returns ``stopped="sandbox"``: the launcher is
        ended first (no message goes into a pipe in use), and the pipes are closed only once
        that request is done with them."""
        self._closed = True
        if not self._lock.acquire(blocking=False):
            self._launcher.stop()  # its EOF wakes the thread in _ask, which then lets go
            if not self._lock.acquire(timeout=SLACK_S):
                # Never close fds under a reader (their numbers could be reused): leave the
                # pipes to the Popen object, remove the rest.
                log.warning("sandbox close: a request did not end after its launcher did")
                self._finalizer.detach()
                shutil.rmtree(self._base, ignore_errors=True)
                return
        try:
            self._finalizer()
        finally:
            self._lock.release()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stage(files: Mapping[str, str] | Path, target: Path) -> None:
    """The initial files in a host folder the launcher copies into the tree."""
    if isinstance(files, str | os.PathLike):
        source = Path(files)
        if not source.is_dir():
            raise ValueError(f"Sandbox files: {source} is not a folder")
        shutil.copytree(source, target, symlinks=True)
        return
    if not isinstance(files, Mapping):
        raise ValueError(
            f"Sandbox files must be a mapping path -> text or a folder, got {type(files).__name__}"
        )
    target.mkdir()
    for path, text in files.items():
        if not isinstance(text, str):
            raise ValueError(f"Sandbox files[{path!r}] must be text, got {type(text).__name__}")
        full = target / _relative(path)
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text, encoding="utf-8")
