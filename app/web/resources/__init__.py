"""One package per REST resource: routes.py (views) and schemas.py (marshmallow)."""
