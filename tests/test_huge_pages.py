"""``pearl.processes.huge_pages``: the environment simulation processes start with."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pearl.processes import huge_pages
from pearl.processes.huge_pages import huge_page_env


@pytest.fixture
def supported(monkeypatch):
    """A host that grants huge pages on request, whatever this one is."""
    monkeypatch.setattr(huge_pages, "_glibc_version", lambda: (2, 36))
    monkeypatch.setattr(huge_pages, "_thp_on_request", lambda: True)
    monkeypatch.setattr(huge_pages.sys, "platform", "linux")


def test_malloc_on_huge_pages_where_granted_and_the_users_tunables_kept(supported):
    assert huge_page_env({}) == {
        "PYTHONMALLOC": "malloc",
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
    }
    mine = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert (
        huge_page_env(mine)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    )
    theirs = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}  # the user's choice stands
    assert huge_page_env(theirs)["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"


def test_with_a_compiled_build_cpythons_allocator_stays_on_huge_arenas(supported):
    assert huge_page_env({}, arenas=True) == {
        "PEARL_HUGE_ARENAS": "1",
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
    }
    assert huge_page_env({"PEARL_HUGE_PAGES": "0"}, arenas=True) == {}
    assert huge_page_env({"PYTHONMALLOC": "malloc"}, arenas=True) == {}


def test_nothing_when_opted_out_or_an_allocator_is_chosen_or_unsupported(supported, monkeypatch):
    assert huge_page_env({"PEARL_HUGE_PAGES": "0"}) == {}
    assert huge_page_env({"PYTHONMALLOC": "pymalloc"}) == {}
    monkeypatch.setattr(huge_pages, "_glibc_version", lambda: (2, 31))  # no hugetlb tunable
    assert huge_page_env({}) == {}
    monkeypatch.setattr(huge_pages, "_glibc_version", lambda: None)  # musl, macOS
    assert huge_page_env({}) == {}


def test_thp_setting_is_read_from_the_kernels_file(tmp_path):
    setting = tmp_path / "enabled"
    for text, on_request in [
        ("always [madvise] never\n", True),
        ("[always] madvise never\n", False),  # CPython's arenas get them without asking
        ("always madvise [never]\n", False),
    ]:
        setting.write_text(text)
        assert huge_pages._thp_on_request(setting) is on_request
    assert huge_pages._thp_on_request(tmp_path / "missing") is False


_ALLOCATE = """
import re
keep = [[i, str(i)] for i in range(1_500_000)]  # ~300 MB of small objects
text = open("/proc/self/smaps_rollup").read()
print(int(re.search(r"AnonHugePages:\\s+(\\d+)", text).group(1)) // 1024)
"""


@pytest.mark.skipif(
    not huge_page_env(), reason="this host grants huge pages to every mapping, or to none"
)
def test_a_process_started_with_it_keeps_its_objects_on_huge_pages():
    """The real effect, on this host (which grants huge pages only on request): most of a
    heap of small objects on 2 MiB pages, and none without the settings."""

    def huge_mb(extra: dict[str, str]) -> int:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONMALLOC", "GLIBC_TUNABLES")}
        out = subprocess.run(
            [sys.executable, "-c", _ALLOCATE], env={**env, **extra}, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return int(out.stdout)

    assert huge_mb(huge_page_env({})) > 60  # 298 MB here (a kernel may find fewer free)
    assert huge_mb({}) < 20
