"""diffq: text-to-image diffusion as durable asynchronous jobs (domain, API and CLI)."""
