"""LoRA adapters: POST/GET /v1/adapters, GET/DELETE /v1/adapters/{id}."""
