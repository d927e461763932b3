"""The launcher behind ``pearl.envs.sandbox.Sandbox``: one process per sandbox that builds the
isolation and runs the agent's commands in it, one at a time.

It is started as a plain script (``python -I -S sandbox_shell.py``), never imported by the
trainer: it imports nothing from PEARL (importing ``pearl`` loads the engine) and it makes
namespace syscalls, which are only safe in a single-threaded process. The host speaks JSON
lines on its stdin/stdout:

1. host -> ``{"mode": "namespaces"|"plain", "tree": DIR, "files": DIR, "limits": {...},
   "python_dirs": [...], "path": "..."}``; launcher -> ``{"ready": true, ...}`` or
   ``{"error": "..."}``.
2. host -> ``{"command": str, "wall_s": float}``; launcher -> ``{"output", "returncode",
   "stopped", "seconds"}``. Also ``{"write": path, "text": str}``, ``{"read": path}`` and
   ``{"exit": true}``.

``namespaces`` mode (Linux, root or unprivileged user namespaces): new mount, pid, network,
IPC and UTS namespaces; this process forks the pid namespace's init, which builds a root of
read-only system binds plus a size-limited tmpfs holding the tree, pivots into it and serves
the requests. Being pid 1, it ends every process of a command with one ``kill(-1)``, setsid
or not; if it dies, the kernel kills the whole namespace. ``plain`` mode: the tree is a host
folder, the launcher is a child subreaper, the disk limit is checked after each command.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import resource
import select
import shutil
import signal
import sys
import time

TREE = "/repo"  # where the tree appears inside a namespaced sandbox
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "nsswitch.conf", "localtime", "mime.types")
DEV_NODES = ("null", "zero", "full", "random", "urandom")
MEMORY_WORDS = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"out of memory")
FILE_SIZE_WORDS = (b"File too large",)  # EFBIG, from a program that ignores SIGXFSZ (Python)
POLL_S = 0.05  # how often a running command's processes and memory are looked at

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = (
    1024,
    2048,
    4096,
    0x4000,
    1 << 18,
    1 << 21,
)
MNT_DETACH = 2
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
PR_CAPBSET_DROP, PR_SET_SECUREBITS = 24, 28
IPC_RMID = 0
NOFILE = 256  # open files per process: also bounds the memfds one process can hold
# Shared memory objects (memfd, MAP_SHARED|MAP_ANONYMOUS) as /proc/<pid>/fd and maps name them.
SHMEM_NAMES = (b"/memfd:", b"/dev/zero (deleted)")
SECBIT_NOROOT_ALL = 0x3 | 0xC  # NOROOT(+locked), NO_SETUID_FIXUP(+locked)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(
        _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data or None)),
        f"mount {target}",
    )


def _bind_readonly(source: str, target: str) -> None:
    """A read-only, nosuid view of ``source`` at ``target``. A remount must keep the flags
    the source mount has locked (nodev, noexec...), or a user namespace refuses it."""
    _mount(source, target, None, MS_BIND | MS_REC)
    kept = os.statvfs(source).f_flag & (
        MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME | MS_RELATIME
    )
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | kept)


class Lines:
    """JSON lines from a file descriptor, with its own buffer (so a command's loop can watch
    the fd for the host going away without losing a request)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer, self.closed = fd, b"", False

    def fill(self) -> None:
        chunk = os.read(self.fd, 65536)
        self.closed = self.closed or not chunk
        self.buffer += chunk

    def next(self) -> dict | None:
        while b"\n" not in self.buffer:
            if self.closed:
                return None
            self.fill()
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


def _send(message: dict) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


class Capture:
    """A command's output: the first and last halves of ``limit`` bytes, the middle dropped."""

    def __init__(self, limit: int) -> None:
        self.limit, self.total = limit, 0
        self.head, self.tail = bytearray(), bytearray()

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.limit - self.limit // 2:
            del self.tail[: len(self.tail) - (self.limit - self.limit // 2)]

    def text(self) -> str:
        dropped = self.total - len(self.head) - len(self.tail)
        note = f"\n[... {dropped} bytes of output dropped ...]\n".encode() if dropped else b""
        return bytes(self.head + note + self.tail).decode("utf-8", errors="replace")


class Running:
    """A started command: its pid, the pipe its output comes through (kept in a Capture, up
    to a ceiling that stops the command), and its wait status once it has exited."""

    def __init__(self, pid: int, read_fd: int, output_bytes: int) -> None:
        self.pid, self.read_fd = pid, read_fd
        self.capture = Capture(output_bytes)
        self.ceiling = max(16 * output_bytes, 1 << 20)
        self.status: int | None = None
        self.pipe_open = True

    def read_over_ceiling(self) -> bool:
        """Reads what the pipe holds (noting its end); says whether the output is past the
        ceiling."""
        chunk = os.read(self.read_fd, 65536)
        if chunk:
            self.capture.add(chunk)
        else:
            self.pipe_open = False
        return self.capture.total > self.ceiling

    def drain(self) -> None:
        """Keeps what was written before the kill, up to the ceiling, till the pipe ends."""
        while self.pipe_open:
            ready = select.select([self.read_fd], [], [], 0.2)[0]
            chunk = os.read(self.read_fd, 65536) if ready else b""
            if self.capture.total <= self.ceiling:
                self.capture.add(chunk[: max(0, self.ceiling - self.capture.total)])
            self.pipe_open = bool(chunk)


class Shell:
    """Runs commands in the tree under the limits; knows how to end all of a command's
    processes in this mode."""

    def __init__(self, config: dict, tree: str, pid_namespace: bool, uid: int | None) -> None:
        self.limits = config["limits"]
        self.tree, self.pid_namespace, self.uid = tree, pid_namespace, uid
        # RLIMIT_NPROC counts every task of the commands' uid: none but theirs when they get
        # their own uid; the two launchers too in a user namespace (root there is this user);
        # the user's whole machine in plain mode without root (a snapshot: best effort).
        if uid is not None:
            self.nproc_others = 0
        elif pid_namespace:
            self.nproc_others = 2
        else:
            self.nproc_others = _tasks_of(os.getuid())
        self.watch_fds: list[int] = []
        self.env = {
            "PATH": config["path"],
            "HOME": tree,
            "PWD": tree,
            "TMPDIR": "/tmp" if pid_namespace else tree,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "PYTHONUNBUFFERED": "1",
            # No .pyc: Python checks a cached module by its source's mtime (whole seconds) and
            # size, so an edit that keeps the size within the second would run the old code.
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        self.bash = shutil.which("bash", path=config["path"]) or "/bin/bash"
        # SIGCHLD wakes the command loop through this pipe: a command that closed its output
        # is answered as soon as it exits, not at the next poll.
        self.child_exits, wake = os.pipe()
        for fd in (self.child_exits, wake):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake, warn_on_full_buffer=False)

    # -- running ------------------------------------------------------------------------
    def _child(self, command: str, write_fd: int) -> None:
        """In the forked child: limits, privileges, then exec bash. Never returns."""
        try:
            os.dup2(write_fd, 1)
            os.dup2(write_fd, 2)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.closerange(3, 65536)
            os.setsid()
            # Python ignores SIGPIPE and SIGXFSZ; exec keeps ignored signals ignored.
            for sig in (
                signal.SIGPIPE,
                signal.SIGXFSZ,
                signal.SIGINT,
                signal.SIGTERM,
                signal.SIGCHLD,
            ):
                signal.signal(sig, signal.SIG_DFL)
            lim = self.limits
            mb = 1024 * 1024
            # SIGXCPU at cpu_s (reported as "cpu"), SIGKILL a second later.
            _limit("RLIMIT_CPU", lim["cpu_s"], lim["cpu_s"] + 1)
            _limit("RLIMIT_AS", lim["memory_mb"] * mb, lim["memory_mb"] * mb)
            _limit("RLIMIT_FSIZE", lim["file_mb"] * mb, lim["file_mb"] * mb)
            _limit("RLIMIT_NOFILE", NOFILE, NOFILE)
            _limit("RLIMIT_CORE", 0, 0)
            nproc = lim["processes"] + self.nproc_others
            _limit("RLIMIT_NPROC", nproc, nproc)
            self._drop_privileges()
            os.chdir(self.tree)
            os.execve(self.bash, ["bash", "-c", command], self.env)
        except BaseException as e:  # noqa: BLE001 - the child must never return into the loop
            os.write(2, f"sandbox: cannot start the command: {e}\n".encode())
        os._exit(127)

    def _drop_privileges(self) -> None:
        """As root: become the sandbox's own uid (RLIMIT_NPROC does not bind uid 0). As root
        of a user namespace (one uid only): drop every capability instead. Either way no
        setuid binary can raise privileges again."""
        if sys.platform.startswith("linux"):
            _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if self.uid is not None and os.getuid() == 0 and self.uid != 0:
            os.setgroups([])
            os.setgid(self.uid)
            os.setuid(self.uid)
        elif os.getuid() == 0 and sys.platform.startswith("linux"):
            for cap in range(64):
                _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
            _libc.prctl(PR_SET_SECUREBITS, SECBIT_NOROOT_ALL, 0, 0, 0)
            header = (ctypes.c_uint32 * 2)(0x20080522, 0)
            data = (ctypes.c_uint32 * 6)()
            _check(_libc.capset(header, data), "capset")

    def run(self, command: str, wall_s: float, host: Lines) -> dict:
        """Runs ``command`` to its end or a limit: its output, exit code, the limit that
        stopped it (or None) and its time."""
        start = time.monotonic()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            self._child(command, write_fd)
        os.close(write_fd)
        running = Running(pid, read_fd, self.limits["output_bytes"])
        stopped = self._watch(running, start + wall_s, host)
        self._end(running)
        returncode = None
        if running.status is not None and stopped is None:
            returncode = os.waitstatus_to_exitcode(running.status)
            stopped = self._why(returncode, running.capture)
        output = running.capture.text()
        if stopped == "output":
            output += f"\n[output passed {running.ceiling} bytes: command stopped]\n"
        if stopped is None:
            stopped = self.disk_full()
        return {
            "output": output,
            "returncode": returncode,
            "stopped": stopped,
            "seconds": time.monotonic() - start,
        }

    def _watch(self, running: Running, deadline: float, host: Lines) -> str | None:
        """Collects the command's output until it has exited and closed it, or until a limit
        stops it (returned); exits the launcher, all killed, once the host is gone."""
        next_look = time.monotonic()
        while running.pipe_open or running.status is None:
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            fds = [running.read_fd] if running.pipe_open else []
            ready, _, _ = select.select(
                fds + [host.fd, self.child_exits, *self.watch_fds],
                [],
                [],
                min(POLL_S, deadline - now),
            )
            if self.child_exits in ready:
                while _read_some(self.child_exits):
                    pass
            if running.read_fd in ready and running.read_over_ceiling():
                return "output"
            if host.fd in ready:
                host.fill()
                if host.closed:  # the host is gone: leave nothing behind
                    self.kill_all()
                    os._exit(0)
            if any(fd in ready for fd in self.watch_fds):
                self.kill_all()
                os._exit(0)
            running.status = self._reap(running.pid, running.status)
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + POLL_S
                over = self._over_limit()
                if over is not None:
                    return over
        return None

    def _over_limit(self) -> str | None:
        """ "processes" or "memory" when the command's processes are past that limit now."""
        tasks, resident = self.usage()
        if tasks >= self.limits["processes"]:
            return "processes"
        if resident > self.limits["memory_mb"] * 1024 * 1024:
            return "memory"
        return None

    def _end(self, running: Running) -> None:
        """Kills whatever the command left running, keeps the output it wrote before, and
        reaps it."""
        try:  # its process group first: all that works where /proc does not (macOS)
            os.killpg(running.pid, signal.SIGKILL)
        except OSError:
            pass
        self.kill_all()
        if self.pid_namespace:
            _remove_sysv_ipc()  # no process is left to use them; their memory goes now
        running.drain()
        os.close(running.read_fd)
        running.status = self._reap(running.pid, running.status, block=True)

    def _why(self, returncode: int, capture: Capture) -> str | None:
        """A limit read off how the command ended (a limit that raises a signal, or a shell
        reporting its child's signal as 128+n; RLIMIT_AS only fails allocations, so memory
        is read off the error message the program printed)."""
        for name, sig in (("cpu", signal.SIGXCPU), ("file_size", signal.SIGXFSZ)):
            if returncode in (-sig, 128 + sig):
                return name
        end = bytes(capture.tail or capture.head)[-4096:]
        if returncode != 0 and any(w in end for w in MEMORY_WORDS):
            return "memory"
        if returncode != 0 and any(w in end for w in FILE_SIZE_WORDS):
            return "file_size"
        return None

    def _reap(self, pid: int, status: int | None, block: bool = False) -> int | None:
        """Reaps every exited child (pid 1 and subreapers inherit orphans), returning the
        command's wait status once it has one."""
        while True:
            try:
                flags = 0 if block and status is None else os.WNOHANG
                got, st = os.waitpid(-1, flags)
            except ChildProcessError:
                return status
            if got == 0:
                return status
            if got == pid:
                status = st

    # -- processes ----------------------------------------------------------------------
    def _processes(self) -> list[int]:
        """Pids of every process a command may have left: all but this one in a pid
        namespace, else this launcher's descendants (orphans come back to it, a subreaper)."""
        me = os.getpid()
        parent_of: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me:
                try:
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        parent_of[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
        if self.pid_namespace:
            return list(parent_of)
        mine, todo = set(), [me]
        while todo:
            current = todo.pop()
            for pid, parent in parent_of.items():
                if parent == current and pid not in mine:
                    mine.add(pid)
                    todo.append(pid)
        return list(mine)

    def usage(self) -> tuple[int, int]:
        """(tasks, memory bytes) of the command's processes; threads count as tasks, as they
        do for RLIMIT_NPROC. Memory is their private and file-backed resident pages plus the
        shared memory objects they hold, each once at its allocated size: memfds and shared
        anonymous mappings, and in an IPC namespace every SysV shm segment. (Mapped tmpfs
        files are left out: the tree's tmpfs is bounded by disk_mb.)"""
        if not os.path.isdir("/proc"):
            return 0, 0
        tasks = resident = 0
        shared: dict[tuple[int, int], int] = {}
        for pid in self._processes():
            try:
                with open(f"/proc/{pid}/status", "rb") as f:
                    for line in f:
                        if line.startswith((b"RssAnon:", b"RssFile:")):
                            resident += int(line.split()[1]) * 1024
                tasks += len(os.listdir(f"/proc/{pid}/task"))
            except (OSError, ValueError, IndexError):
                continue
            _shared_memory_of(pid, shared)
        sysv = _sysv_shm_bytes() if self.pid_namespace else 0
        return tasks, resident + sum(shared.values()) + sysv

    def kill_all(self) -> None:
        """Ends every process but this one. As pid 1 one ``kill(-1)`` does it (the kernel
        holds the task list while it signals, so a fork bomb cannot outrun it)."""
        for _ in range(100):
            if self.pid_namespace:
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            else:
                for pid in self._processes() if os.path.isdir("/proc") else []:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            self._reap(-2, None)
            if not os.path.isdir("/proc") or not self._processes():
                return
            time.sleep(0.01)

    def disk_full(self) -> str | None:
        """Says "disk" once the tree's filesystem (namespaces) or the tree (plain) is full."""
        if self.pid_namespace:
            st = os.statvfs(self.tree)
            return "disk" if st.f_bavail * st.f_frsize < 64 * 1024 or st.f_favail == 0 else None
        used = 0
        for folder, _, names in os.walk(self.tree):
            for name in names:
                try:
                    used += os.lstat(os.path.join(folder, name)).st_blocks * 512
                except OSError:
                    continue
        return "disk" if used > self.limits["disk_mb"] * 1024 * 1024 else None

    # -- files --------------------------------------------------------------------------
    def _inside(self, path: str) -> str:
        """The absolute path of ``path`` in the tree, refusing one that leaves it (through
        ``..`` or a symlink the command made)."""
        full = os.path.realpath(os.path.join(self.tree, path))
        if os.path.commonpath([full, os.path.realpath(self.tree)]) != os.path.realpath(self.tree):
            raise ValueError(f"path {path!r} leaves the sandbox's tree")
        return full

    def write(self, path: str, text: str) -> None:
        full = self._inside(path)
        folder = os.path.dirname(full)
        os.makedirs(folder, exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
        if self.uid is not None and os.getuid() == 0:
            while True:  # the command's uid owns what the host writes, folders included
                os.chown(full, self.uid, self.uid)
                if full == os.path.realpath(self.tree):
                    break
                full = os.path.dirname(full)

    def read(self, path: str) -> str:
        with open(self._inside(path), encoding="utf-8", errors="replace") as f:
            return f.read()


def _limit(name: str, soft: int, hard: int) -> None:
    """Lowers rlimit ``name`` (never above the hard limit the launcher got). Linux enforces
    all of them; elsewhere (macOS has no working RLIMIT_AS) one that is refused is skipped."""
    which = getattr(resource, name, None)
    if which is None:
        return
    _, current = resource.getrlimit(which)
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    try:
        resource.setrlimit(which, (soft, hard))
    except (OSError, ValueError):
        if sys.platform.startswith("linux"):
            raise


def _shared_memory_of(pid: int, seen: dict[tuple[int, int], int]) -> None:
    """Adds the shared memory objects ``pid`` holds to ``seen`` ((dev, inode) -> allocated
    bytes): memfds among its open files (not in any RSS, nor under RLIMIT_AS) and memfd or
    shared anonymous mappings (under RLIMIT_AS, and their pages stay in the object after
    MADV_DONTNEED). Their mapped pages are RssShmem, which ``usage`` leaves out."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        names = []
    for name in names:
        path = f"/proc/{pid}/fd/{name}"
        try:
            if not os.readlink(path).encode().startswith(SHMEM_NAMES[0]):
                continue
            st = os.stat(path)
        except OSError:
            continue
        seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            maps = f.read()
    except OSError:
        return
    if not any(name in maps for name in SHMEM_NAMES):
        return
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith(SHMEM_NAMES):
            continue
        try:
            major, minor = (int(x, 16) for x in fields[3].split(b":"))
            key = (os.makedev(major, minor), int(fields[4]))
            if key in seen:
                continue
            start, end = (int(x, 16) for x in fields[0].split(b"-"))
        except ValueError:
            continue
        try:  # map_files needs CAP_SYS_ADMIN (root); else the mapping's length bounds it
            seen[key] = os.stat(f"/proc/{pid}/map_files/{fields[0].decode()}").st_blocks * 512
        except OSError:
            seen[key] = end - start


def _sysv_table(kind: str) -> list[dict[str, str]]:
    """Rows of /proc/sysvipc/<kind> (this IPC namespace's shm, msg or sem objects)."""
    try:
        with open(f"/proc/sysvipc/{kind}") as f:
            header, *rows = f.read().splitlines()
    except (OSError, ValueError):
        return []
    names = header.split()
    return [dict(zip(names, row.split(), strict=False)) for row in rows]


def _sysv_shm_bytes() -> int:
    """Resident bytes of every SysV shm segment in this IPC namespace, attached or not."""
    return sum(int(row.get("rss", "0")) + int(row.get("swap", "0")) for row in _sysv_table("shm"))


def _remove_sysv_ipc() -> None:
    """Removes this IPC namespace's SysV shm segments, message queues and semaphores (a
    command's leftovers, which would otherwise hold memory until the sandbox closes)."""
    for kind, column, remove in (
        ("shm", "shmid", lambda i: _libc.shmctl(i, IPC_RMID, None)),
        ("msg", "msqid", lambda i: _libc.msgctl(i, IPC_RMID, None)),
        ("sem", "semid", lambda i: _libc.semctl(i, 0, IPC_RMID)),
    ):
        for row in _sysv_table(kind):
            if column in row:
                remove(int(row[column]))


def _limit_ipc(memory_mb: int) -> bool:
    """Bounds SysV IPC in this (new) IPC namespace: all shm segments together at most
    ``memory_mb``, few message queues. Pid 1 may write its own namespace's sysctls; says
    whether every value was written and reads back as set."""
    limit = int(memory_mb * 1024 * 1024)
    values = {
        "shmmax": limit,  # one segment
        "shmall": limit // os.sysconf("SC_PAGE_SIZE"),  # all segments, in pages
        "shmmni": 64,  # segments
        "shm_rmid_forced": 1,  # a segment goes once no process has it attached
        "msgmni": 16,  # message queues (each at most msgmnb, 16 KiB by default)
    }
    try:
        for name, value in values.items():
            with open(f"/proc/sys/kernel/{name}", "w") as f:
                f.write(str(value))
        for name, value in values.items():
            with open(f"/proc/sys/kernel/{name}") as f:
                if int(f.read()) != value:
                    return False
    except (OSError, ValueError):
        return False
    return True


def _read_some(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


def _tasks_of(uid: int) -> int:
    """Tasks (threads included) that ``uid`` runs on this machine, from /proc."""
    count = 0
    for entry in _listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
        except (OSError, ValueError, KeyError):
            continue
    return count


# -- namespaces -----------------------------------------------------------------------------
def _pick_uid(pid: int) -> int:
    """A uid no one else uses, so RLIMIT_NPROC counts this sandbox only: high in the largest
    range this container maps, offset by the launcher's pid (unique while it runs)."""
    ranges = []
    with open("/proc/self/uid_map") as f:
        for line in f:
            inside, _, count = (int(x) for x in line.split())
            ranges.append((count, inside))
    count, first = max(ranges)
    if count > 2_000_000_000:
        return 1_600_000_000 + pid % 100_000_000
    half = count // 2
    return first + half + pid % max(1, count - half - 2)


def _enter_namespaces() -> bool:
    """Unshares mount, pid, net, IPC and UTS namespaces (plus a user namespace when not root,
    mapping this user to root in it). Returns whether a user namespace was made."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    uid, gid = os.getuid(), os.getgid()
    user = uid != 0
    _check(_libc.unshare(flags | (CLONE_NEWUSER if user else 0)), "unshare")
    if user:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")
    return user


def _build_root(config: dict, uid: int | None) -> None:
    """In the new mount namespace, as the pid namespace's init: a root of read-only system
    binds, a minimal /etc and /dev, /proc, and one tmpfs of ``disk_mb`` holding /repo,
    /tmp and /dev/shm; then pivot into it and make it read-only."""
    new = config["tree"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=755")
    _bind_system_dirs(new)
    _write_etc(new, uid)
    _mount_proc_and_dev(new)
    _mount_disk(new, config["limits"]["disk_mb"])
    # The Python that runs PEARL, after /tmp and /dev/shm: a venv under /tmp (a fresh clone
    # there, say) would be hidden by the tmpfs mounted over /tmp otherwise.
    _bind_python_dirs(new, config["python_dirs"])
    _copy_tree(config["files"], new + TREE)
    if uid is not None:
        _chown_below(new + TREE, uid)
        os.chown(new + TREE, uid, uid)
    _pivot_into(new)


def _bind_system_dirs(new: str) -> None:
    """The host's system folders in the root at ``new``, read-only (symlinks stay links)."""
    for name in SYSTEM_DIRS:
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), f"{new}/{name}")
        elif os.path.isdir(host):
            os.mkdir(f"{new}/{name}")
            _bind_readonly(host, f"{new}/{name}")


def _write_etc(new: str, uid: int | None) -> None:
    """A minimal /etc: the dynamic loader's and libc's files, users root and sandbox, hosts."""
    os.makedirs(f"{new}/etc/ld.so.conf.d")
    for name in ETC_FILES + tuple(f"ld.so.conf.d/{n}" for n in _listdir("/etc/ld.so.conf.d")):
        if os.path.isfile(f"/etc/{name}"):
            shutil.copyfile(f"/etc/{name}", f"{new}/etc/{name}")
    user = uid if uid is not None else 0
    with open(f"{new}/etc/passwd", "w") as f:
        f.write(f"root:x:0:0:root:/root:/bin/bash\nsandbox:x:{user}:{user}::{TREE}:/bin/bash\n")
    with open(f"{new}/etc/group", "w") as f:
        f.write(f"root:x:0:\nsandbox:x:{user}:\n")
    with open(f"{new}/etc/hosts", "w") as f:
        f.write("127.0.0.1 localhost\n::1 localhost\n")


def _mount_proc_and_dev(new: str) -> None:
    """This pid namespace's /proc, and a /dev of the harmless nodes and the fd links."""
    os.makedirs(f"{new}/proc")
    _mount("proc", f"{new}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(f"{new}/dev")
    for name in DEV_NODES:
        open(f"{new}/dev/{name}", "w").close()
        _mount(f"/dev/{name}", f"{new}/dev/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{new}/dev/{name}")
    os.symlink("/proc/self/fd/1", f"{new}/dev/stdout")
    os.symlink("/proc/self/fd/2", f"{new}/dev/stderr")


def _mount_disk(new: str, disk_mb: int) -> None:
    """One tmpfs of ``disk_mb`` shared by /repo, /tmp and /dev/shm, so together they
    cannot pass the disk limit."""
    disk = f"{new}/.disk"
    os.mkdir(disk)
    inodes = max(4096, disk_mb * 256)
    _mount(
        "tmpfs",
        disk,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={disk_mb}m,nr_inodes={inodes},mode=755",
    )
    for name, where, mode in (
        ("repo", TREE, 0o755),
        ("tmp", "/tmp", 0o1777),
        ("shm", "/dev/shm", 0o1777),
    ):
        os.mkdir(f"{disk}/{name}")
        os.chmod(f"{disk}/{name}", mode)
        os.makedirs(new + where, exist_ok=True)
        _mount(f"{disk}/{name}", new + where, None, MS_BIND)
    _check(_libc.umount2(disk.encode(), MNT_DETACH), "umount disk")
    os.rmdir(disk)


def _bind_python_dirs(new: str, python_dirs: list[str]) -> None:
    """The Python's folders outside the system folders, read-only at their host paths."""
    for folder in sorted(set(python_dirs)):
        real = os.path.realpath(folder)
        if any(os.path.commonpath([real, f"/{d}"]) == f"/{d}" for d in SYSTEM_DIRS):
            continue
        if not os.path.isdir(real) or os.path.isdir(new + real):
            continue
        os.makedirs(new + real, mode=0o755)
        _bind_readonly(real, new + real)


def _chown_below(tree: str, uid: int) -> None:
    """Gives everything below ``tree`` (not ``tree`` itself) to ``uid``, links not followed."""
    for folder, dirs, names in os.walk(tree):
        for name in [*dirs, *names]:
            os.lchown(os.path.join(folder, name), uid, uid)


def _pivot_into(new: str) -> None:
    """Makes ``new`` the root, drops the old one, and remounts the new one read-only."""
    os.mkdir(f"{new}/.old")
    number = PIVOT_ROOT.get(os.uname().machine, -1)  # no libc wrapper; -1 fails with ENOSYS
    _check(_libc.syscall(number, new.encode(), f"{new}/.old".encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _listdir(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _copy_tree(source: str, target: str) -> None:
    """The host's files into the tree (a full tmpfs fails this with ENOSPC)."""
    for name in _listdir(source):
        src, dst = os.path.join(source, name), os.path.join(target, name)
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst, follow_symlinks=False)


def serve(shell: Shell, host: Lines, ready: dict) -> None:
    """Answers the host's requests until it says exit or goes away."""
    _send(ready)
    while True:
        request = host.next()
        if request is None or request.get("exit"):
            shell.kill_all()
            return
        try:
            if "command" in request:
                _send(shell.run(request["command"], float(request["wall_s"]), host))
            elif "write" in request:
                shell.write(request["write"], request["text"])
                _send({"ok": True})
            elif "read" in request:
                _send({"text": shell.read(request["read"])})
            else:
                _send({"error": f"unknown request {sorted(request)}"})
        except (OSError, ValueError, UnicodeError) as e:
            shell.kill_all()  # a command that failed midway leaves nothing running
            _send({"error": f"{type(e).__name__}: {e}"})


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer's Ctrl-C is the host's to handle
    host = Lines(0)
    config = host.next()
    if config is None:
        return
    if config["mode"] != "namespaces":
        if sys.platform.startswith("linux"):
            _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        uid = (
            _pick_uid(os.getpid())
            if os.getuid() == 0 and os.path.exists("/proc/self/uid_map")
            else None
        )
        shell = Shell(config, config["tree"], pid_namespace=False, uid=uid)
        # The host's close() during a command: end the command's processes too (they would
        # outlive a killed launcher here, having no pid namespace).
        signal.signal(signal.SIGTERM, lambda *_: (shell.kill_all(), os._exit(0)))
        if uid is not None:
            os.chown(config["tree"], uid, uid)
        _copy_tree(config["files"], config["tree"])
        if uid is not None:
            _chown_below(config["tree"], uid)
        serve(shell, host, {"ready": True, "namespaces": False, "uid": uid, "tree": config["tree"]})
        return
    try:
        user_namespace = _enter_namespaces()
    except OSError as e:
        _send({"error": f"cannot make namespaces: {e}"})
        return
    uid = None if user_namespace else _pick_uid(os.getpid())
    alive_read, alive_write = os.pipe()
    child = os.fork()
    if child == 0:  # pid 1 of the new pid namespace
        os.close(alive_write)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        try:
            _build_root(config, uid)
        except (OSError, ValueError) as e:
            _send({"error": f"cannot build the sandbox's root: {e}"})
            os._exit(1)
        ipc_limited = _limit_ipc(config["limits"]["memory_mb"])
        shell = Shell(config, TREE, pid_namespace=True, uid=uid)
        shell.watch_fds = [alive_read]  # readable (EOF) once the outer launcher is gone
        ready = {"ready": True, "namespaces": True, "user_namespace": user_namespace}
        ready["ipc_limited"] = ipc_limited
        serve(shell, host, {**ready, "uid": uid, "tree": TREE})
        os._exit(0)
    os.close(alive_read)
    os.close(0)  # only the init reads requests
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)


if __name__ == "__main__":
    main()
