"""Folders on a host's shared memory (/dev/shm) that one process owns while it lives, and
the removal of those whose owner is gone.

A vLLM server keeps its sessions' KV files, weights in transit and its engine's IPC
sockets in such a folder (``pearl.live.vllm_server``); a killed server leaves it behind,
so each new server first removes the abandoned ones. A process id is no proof of death:
containers sharing /dev/shm (Docker ``--ipc=host``, common with vLLM) see each other's
files but not each other's processes. A lock is: the owner holds ``flock(LOCK_EX)`` on the
folder's lock file for as long as it lives (the kernel drops it when the process ends,
however it ends; a child it forks without exec holds it too), and a cleaner removes a
folder only once it has taken that lock itself, without waiting (``LOCK_EX | LOCK_NB``).
flock is kept on the file, whatever PID namespace its holders run in.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

LOCK_FILE = "owner.lock"
# A folder without a lock file (made by PEARL before owners held locks, or by an owner
# between making it and locking it, a few microseconds) is removed only when no process
# here has its id AND nothing in it changed for a day: its owner may be alive in another
# PID namespace, and a live server writes KV files every few turns; an idle one that keeps
# its folder untouched for a day loses it (then /dev/shm does not fill with the folders of
# servers killed before this release).
UNLOCKED_IDLE_S = 24 * 3600


@dataclass(slots=True)
class OwnedFolder:
    """A folder ``<where>/<prefix><pid>-<name>-<random>`` this process owns until
    ``remove``; ``remove_abandoned`` in any process leaves it alone meanwhile."""

    path: str
    _lock_fd: int | None

    @classmethod
    def create(cls, where: str, prefix: str, name: str) -> OwnedFolder:
        """Make the folder and take its lock (held by this process, and by children it
        forks, until ``remove``)."""
        path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{name}-", dir=where)
        # Locked under a name of its own, then renamed into place: a cleaner that finds
        # LOCK_FILE finds it locked (until then it sees a new folder without a lock file,
        # which it leaves alone).
        fd, pending = tempfile.mkstemp(prefix=".lock-", dir=path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(pending, os.path.join(path, LOCK_FILE))
        except OSError:
            os.close(fd)
            shutil.rmtree(path, ignore_errors=True)
            raise
        return cls(path, fd)

    def remove(self) -> None:
        """Remove the folder, then let go of its lock (no cleaner races the removal)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def remove_abandoned(where: str, prefix: str) -> list[str]:
    """Remove the folders ``<where>/<prefix>*`` whose owner is gone (their lock free, or
    for folders without a lock file, ``UNLOCKED_IDLE_S``); return the removed ones."""
    removed = []
    for folder in glob.glob(os.path.join(glob.escape(where), glob.escape(prefix) + "*")):
        if os.path.islink(folder) or not os.path.isdir(folder):
            continue
        try:
            fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            if _unlocked_and_abandoned(folder, prefix):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
            continue
        except OSError:
            continue  # another user's (or not a plain file): not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its owner holds it: alive, in whatever namespace
        try:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


def _unlocked_and_abandoned(folder: str, prefix: str) -> bool:
    """A folder without a lock file: gone only if both its process id and its age say so.
    The id alone would remove a live owner's folder from another PID namespace; the age
    alone, a live owner's that was idle. Folders not named by a process id are left."""
    pid = os.path.basename(folder)[len(prefix) :].split("-")[0]
    if not pid.isdigit() or _process_visible(int(pid)):
        return False
    try:
        with os.scandir(folder) as entries:
            changed = [
                os.lstat(folder).st_mtime,
                *(e.stat(follow_symlinks=False).st_mtime for e in entries),
            ]
    except OSError:
        return False
    return time.time() - max(changed) > UNLOCKED_IDLE_S


def _process_visible(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: another user's process, alive
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
