"""The task runner: workers that claim tasks, the generation of a task, its plan,
recovery after a restart, retention and revocation."""
