"""Accelerator specifications for the cost model: a small catalog plus custom specs.

Units throughout: FLOP/s, bytes, and bytes per second ("Bps" = bytes/s, never bits).
Every link bandwidth is *unidirectional per GPU* (what one GPU can send, or receive,
at once), because that is what a ring all-reduce or a point-to-point copy is bound by;
vendor datasheets quote NVLink as the bidirectional total, so those numbers are halved.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from pearl.errors import ConfigError

GB = 1e9
"""Decimal gigabyte (datasheets use decimal units)."""
TB = 1e12
"""Decimal terabyte."""
TFLOPS = 1e12
"""Tera floating-point operations per second."""
GBIT = 1e9 / 8
"""One gigabit per second, in bytes per second (network ports are quoted in bits)."""


@dataclass(slots=True, frozen=True)
class GPUSpec:
    """One accelerator's peak numbers; the cost model applies efficiencies on top."""

    name: str
    peak_flops: float
    """Dense (no structured sparsity) bf16 tensor-core FLOP/s."""
    hbm_bytes: float
    """Device memory capacity in bytes."""
    hbm_bandwidth_Bps: float
    """Device memory bandwidth in bytes/s."""
    nvlink_bandwidth_Bps: float
    """Intra-node GPU-to-GPU bandwidth per GPU per direction, bytes/s."""
    network_bandwidth_Bps: float
    """Inter-node (NIC) bandwidth available to one GPU per direction, bytes/s."""
    gpus_per_node: int
    """GPUs sharing one NVLink domain (one server)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "name":
                if not isinstance(self.name, str) or not self.name:
                    raise ConfigError(f"GPUSpec.name must be a non-empty string, got {self.name!r}")
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(
                    f"GPUSpec {self.name!r}: field {f.name!r} must be a positive number, "
                    f"got {value!r}"
                )
        if not isinstance(self.gpus_per_node, int):
            raise ConfigError(
                f"GPUSpec {self.name!r}: field 'gpus_per_node' must be an integer, "
                f"got {self.gpus_per_node!r}"
            )

    @property
    def node_network_bandwidth_Bps(self) -> float:
        """All NICs of one node together, bytes/s per direction."""
        return self.network_bandwidth_Bps * self.gpus_per_node


# --- Catalog -------------------------------------------------------------------------------
# Sources are NVIDIA's product datasheets (H100/H800 "NVIDIA H100 Tensor Core GPU",
# "NVIDIA H200 Tensor Core GPU", "NVIDIA A100 Tensor Core GPU", "NVIDIA DGX B200"/HGX
# B200) and the matching DGX system datasheets for the per-GPU NIC. Datasheets quote bf16
# "with sparsity"; the dense number is half of it. Values were checked against public
# spec summaries but not against a live datasheet in this session: treat as well-known
# datasheet values.

H100 = GPUSpec(
    name="H100",
    # H100 SXM5 datasheet: BF16 tensor core 1,979 TFLOPS with sparsity -> 989.4 dense.
    peak_flops=989.4 * TFLOPS,
    # H100 SXM5 datasheet: 80 GB HBM3.
    hbm_bytes=80 * GB,
    # H100 SXM5 datasheet: 3.35 TB/s.
    hbm_bandwidth_Bps=3.35 * TB,
    # H100 SXM5 datasheet: NVLink 900 GB/s (bidirectional total) -> 450 GB/s per direction.
    nvlink_bandwidth_Bps=450 * GB,
    # DGX H100 datasheet: 8x ConnectX-7 400 Gb/s, one per GPU -> 50 GB/s per GPU.
    network_bandwidth_Bps=400 * GBIT,
    gpus_per_node=8,
)

H800 = GPUSpec(
    name="H800",
    # H800 SXM5 = H100 SXM5 silicon and memory (same 989.4 dense bf16 TFLOPS, 80 GB HBM3,
    # 3.35 TB/s) with NVLink cut to 400 GB/s bidirectional -> 200 GB/s per direction.
    peak_flops=989.4 * TFLOPS,
    hbm_bytes=80 * GB,
    hbm_bandwidth_Bps=3.35 * TB,
    nvlink_bandwidth_Bps=200 * GB,
    # PEARL's cluster: "GPU nodes are interconnected via 800 Gbps InfiniBand". We read it
    # as 800 Gb/s per 8-GPU node (100 Gb/s = 12.5 GB/s per GPU), the conservative reading;
    # if it meant per GPU, use a profile with network_bandwidth_Bps = 100e9.
    network_bandwidth_Bps=800 * GBIT / 8,
    gpus_per_node=8,
)

H200 = GPUSpec(
    name="H200",
    # H200 SXM datasheet: BF16 1,979 TFLOPS with sparsity -> 989.4 dense (same die as H100).
    peak_flops=989.4 * TFLOPS,
    # H200 SXM datasheet: 141 GB HBM3e at 4.8 TB/s.
    hbm_bytes=141 * GB,
    hbm_bandwidth_Bps=4.8 * TB,
    # H200 SXM datasheet: NVLink 900 GB/s bidirectional -> 450 GB/s per direction.
    nvlink_bandwidth_Bps=450 * GB,
    # DGX H200 datasheet: 8x ConnectX-7 400 Gb/s, one per GPU.
    network_bandwidth_Bps=400 * GBIT,
    gpus_per_node=8,
)

A100_80G = GPUSpec(
    name="A100-80G",
    # A100 80GB SXM datasheet: BF16 312 TFLOPS dense (624 with sparsity).
    peak_flops=312 * TFLOPS,
    # A100 80GB SXM datasheet: 80 GB HBM2e at 2,039 GB/s.
    hbm_bytes=80 * GB,
    hbm_bandwidth_Bps=2039 * GB,
    # A100 SXM datasheet: NVLink 600 GB/s bidirectional -> 300 GB/s per direction.
    nvlink_bandwidth_Bps=300 * GB,
    # DGX A100 datasheet: 8x ConnectX-6 200 Gb/s HDR InfiniBand, one per GPU.
    network_bandwidth_Bps=200 * GBIT,
    gpus_per_node=8,
)

B200 = GPUSpec(
    name="B200",
    # HGX B200 datasheet (1,000 W part): FP16/BF16 4.5 PFLOPS with sparsity -> 2.25 dense.
    peak_flops=2250 * TFLOPS,
    # HGX/DGX B200 datasheet: 1,440 GB HBM3e per 8 GPUs -> 180 GB each, 8 TB/s each.
    hbm_bytes=180 * GB,
    hbm_bandwidth_Bps=8 * TB,
    # Fifth-generation NVLink: 1.8 TB/s bidirectional per GPU -> 900 GB/s per direction.
    nvlink_bandwidth_Bps=900 * GB,
    # DGX B200 datasheet: 8x ConnectX-7 400 Gb/s compute-fabric ports, one per GPU.
    network_bandwidth_Bps=400 * GBIT,
    gpus_per_node=8,
)

CPU_PLACEHOLDER = GPUSpec(
    name="cpu",
    # Placeholder for "this CPU": calibration fits the real numbers and saves them in a
    # profile (pearl.sim.cost_profile). Order of magnitude of a 2-core AVX2 fp32 machine.
    peak_flops=50e9,
    hbm_bytes=8 * GB,
    hbm_bandwidth_Bps=10 * GB,
    # "Intra-node" copies between CPU workers go through shared memory.
    nvlink_bandwidth_Bps=5 * GB,
    # A 10 GbE port.
    network_bandwidth_Bps=10 * GBIT,
    gpus_per_node=1,
)

GPU_CATALOG: dict[str, GPUSpec] = {
    spec.name: spec for spec in (H800, H100, H200, A100_80G, B200, CPU_PLACEHOLDER)
}
"""Built-in specs by canonical name."""

_ALIASES = {
    "h100-sxm": "H100",
    "h100-sxm5": "H100",
    "h800-sxm": "H800",
    "h800-sxm5": "H800",
    "h200-sxm": "H200",
    "a100": "A100-80G",
    "a100-sxm": "A100-80G",
    "a100-80gb": "A100-80G",
    "b200-sxm": "B200",
}


def get_gpu(name: str) -> GPUSpec:
    """The catalog spec called ``name`` (case-insensitive, common aliases accepted)."""
    lowered = name.lower()
    for key, spec in GPU_CATALOG.items():
        if key.lower() == lowered:
            return spec
    if lowered in _ALIASES:
        return GPU_CATALOG[_ALIASES[lowered]]
    raise ConfigError(
        f"unknown GPU {name!r}; known: {', '.join(GPU_CATALOG)} "
        "(or give a custom GPUSpec in a profile file)"
    )
