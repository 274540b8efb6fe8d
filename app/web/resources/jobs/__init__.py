"""Generation jobs: submit, read, list, download."""
