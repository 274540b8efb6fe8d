"""The model catalog: each model's limits, and how long a job would take on it."""
