"""The HTTP API: app factory, routes, SSE and auth."""
