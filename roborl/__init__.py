"""roborl: batched robot RL. See README.md and docs/architecture.md for the architecture."""
__version__ = "0.1.0"
