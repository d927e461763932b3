"""The programs: each a thin driver over one world (or both), above the control plane and
the worlds: `pearl train`, `pearl simulate`, `pearl calibrate` and the paper's experiments."""
