"""Signed downloads of locally stored images (the local-folder storage's presigned URLs)."""
