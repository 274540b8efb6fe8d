"""The GPU runtime: pipeline loading, device pinning, generation, encoding, job execution."""
