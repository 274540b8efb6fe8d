"""Webhooks: events recorded with the state change that causes them, delivered by CPU
workers from the `webhooks` queue, signed per Standard Webhooks, behind an SSRF guard."""
