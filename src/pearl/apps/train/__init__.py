"""`pearl train`: live asynchronous GRPO (config, run, per-step metrics, report)."""
