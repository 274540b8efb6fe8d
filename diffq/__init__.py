"""diffq's Python package for clients: `diffq.client` (docs/clients.md)."""
