"""The OpenAI-compatible images endpoint."""
