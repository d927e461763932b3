"""Workloads: agentic trajectory profiles (agentic), JSONL rollout traces (traces), and
preemptible-GPU availability traces (availability). Import the submodules directly."""
