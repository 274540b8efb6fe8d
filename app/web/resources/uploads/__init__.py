"""Input images: upload, look up, download, forget."""
