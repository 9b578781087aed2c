"""The OpenAI-compatible HTTP server (the `serve` extra): config, service, app, metrics."""
