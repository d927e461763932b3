"""The live runtime is a single-machine one: nothing of Ray's listens outside loopback."""

import ipaddress
import os

import pytest
from procfs import process_tree


def _socket_inodes(pids: set[int]) -> dict[int, int]:
    """socket inode -> pid holding it."""
    inodes = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes[int(link[8:-1])] = pid
    return inodes


def _listening() -> list[tuple[ipaddress._BaseAddress, int, int]]:
    """(address, port, inode) of every listening TCP socket of the machine."""
    rows = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        try:
            with open(f"/proc/net/{table}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            if v6:  # four little-endian 32-bit words
                ip = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
            else:
                ip = ipaddress.IPv4Address(raw[::-1])
            rows.append((ip, int(port, 16), int(fields[9])))
    return rows


def _is_loopback(ip) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")
def test_no_ray_process_listens_outside_loopback():
    ray = pytest.importorskip("ray")
    from pearl.live.cluster import ensure_ray

    if ray.is_initialized():
        ray.shutdown()
    ensure_ray(num_cpus=1)
    try:

        @ray.remote(num_cpus=1)
        class Probe:
            def ping(self) -> int:
                return os.getpid()

        probe = Probe.remote()
        ray.get(probe.ping.remote())
        inodes = _socket_inodes(process_tree(os.getpid()))
        ours = [(ip, port, inodes[inode]) for ip, port, inode in _listening() if inode in inodes]
        assert ours, "found no listening socket of Ray's processes: the probe is broken"
        outside = [(str(ip), port, pid) for ip, port, pid in ours if not _is_loopback(ip)]
        assert not outside, f"listening outside 127.0.0.0/8: {outside}"
    finally:
        ray.shutdown()
