"""The application: use cases that the transports (HTTP, the CLI) call, and the composition root."""
