"""The test bed shared by tests/ and bench/: private services (PostgreSQL, RabbitMQ,
SeaweedFS S3), the API and workers as processes, HTTP clients for jobs, fault proxies,
and factories for in-process runs (`factories.py`). Not part of the product: it is not
installed, and nothing in app/, tasks/ or workers/ imports it."""
