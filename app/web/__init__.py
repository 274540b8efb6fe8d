"""The HTTP API: Flask + flask-smorest. Never imports torch, diffusers or workers."""
