"""Tasks: the pure state machine, the runner, startup recovery and retention."""
