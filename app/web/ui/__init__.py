"""The browser page at /ui and the offline interactive docs at /docs."""
