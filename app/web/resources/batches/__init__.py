"""Batches (POST /v1/batches and the rest) and the Files API that OpenAI's batches use."""
