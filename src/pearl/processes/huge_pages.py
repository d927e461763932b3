"""The environment simulation processes start with: Python's objects on huge pages.

A simulated run is pointer-chasing over a heap of 10^5-10^7 small objects (each worker's
scheduler, block tables, sequences; each trajectory's context), and every event lands on a
worker whose objects left the caches hundreds of events ago. With 4 KiB pages a large
fleet's heap spans far more pages than the TLB maps, so a first touch often misses the
TLB: the scale penalty of the 512-worker step (0.72 ms a turn against 0.51 at 64 workers,
benchmarks/README "Issue 36"). On 2 MiB transparent huge pages the same run took 0.81x the
time at 256 workers and 0.79-0.81x at 512, with the same results (benchmarks/README,
"eighth stop").

CPython's own small-object allocator maps its arenas itself (1 MiB ``mmap``s, which no
setting puts on huge pages when the kernel grants them only on request, ``madvise`` mode,
the common default); glibc's ``malloc`` asks for them (``madvise(MADV_HUGEPAGE)``) when its
``glibc.malloc.hugetlb=1`` tunable is set. So where the compiled modules are built
(``pearl.native``), whose build carries an arena allocator that asks for huge pages
(``pearl/huge_arenas.c``, ``PEARL_HUGE_ARENAS=1``), objects of up to 512 bytes stay in
CPython's allocator, on huge pages, and larger ones go to glibc's, on huge pages too: the
512-worker step took 0.91x and 0.94x the time of everything in ``malloc`` on huge pages
(benchmarks/README, "thirteenth stop"). Without a build, everything goes to ``malloc``
(``PYTHONMALLOC=malloc``) on huge pages. These settings are read as the
interpreter starts, so they apply to the processes PEARL starts for simulations (the local
pool's and Ray's), not to the process that starts them. ``malloc`` alone, without huge
pages, is slower than CPython's allocator (1.08x the time at 256 workers): the two go
together or not at all.

Left out where they cannot help (not Linux with glibc >= 2.35; transparent huge pages off,
or on for every mapping, where CPython's arenas get them without asking), when the user
chose an allocator (``PYTHONMALLOC`` set), and when ``PEARL_HUGE_PAGES=0``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _glibc_version() -> tuple[int, int] | None:
    try:
        name = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
    except (ValueError, OSError, AttributeError):  # not glibc, or no confstr
        return None
    kind, _, version = name.partition(" ")
    major, _, minor = version.partition(".")
    if kind != "glibc" or not (major.isdigit() and minor.isdigit()):
        return None
    return int(major), int(minor)


def _thp_on_request(setting: Path = THP_SETTING) -> bool:
    """Transparent huge pages granted only where a program asks (``[madvise]``): with
    ``[always]`` CPython's arenas get them already, with ``[never]`` nothing does."""
    try:
        return "[madvise]" in setting.read_text()
    except OSError:
        return False


def huge_page_env(environ: Mapping[str, str] | None = None, arenas: bool = False) -> dict[str, str]:
    """The variables to add to ``environ`` (default: this process's) so that a Python started
    with them keeps its objects on transparent huge pages; empty when that would not help
    or the user said otherwise (the module's doc). ``arenas``: the process loads a
    compiled build (``PEARL_NATIVE=1``), whose arena allocator keeps CPython's own."""
    env = os.environ if environ is None else environ
    if env.get("PEARL_HUGE_PAGES", "1") == "0" or "PYTHONMALLOC" in env:
        return {}
    glibc = _glibc_version()
    if sys.platform != "linux" or glibc is None or glibc < (2, 35) or not _thp_on_request():
        return {}
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" not in tunables:
        tunables = f"{tunables}:{TUNABLE}" if tunables else TUNABLE
    if arenas:
        return {"PEARL_HUGE_ARENAS": "1", "GLIBC_TUNABLES": tunables}
    return {"PYTHONMALLOC": "malloc", "GLIBC_TUNABLES": tunables}
