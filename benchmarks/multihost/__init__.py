"""Multi-host step time of the trainer (2 processes x 4 devices vs 1 x 8)."""
