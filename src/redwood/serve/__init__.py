"""`redwood serve`: the OpenAI-compatible HTTP server."""
