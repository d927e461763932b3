"""The paper's measurements on the simulator: characterization rows (regime), the decision
engine against replay (ratio_selection), the Fig 7 ladder (ablation)."""
