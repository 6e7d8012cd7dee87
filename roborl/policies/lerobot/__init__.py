"""LeRobot's policies (SmolVLA, ACT, Diffusion Policy) run by roborl: `policy.kind: lerobot` (the lerobot extra)."""
