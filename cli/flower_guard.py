"""Flower, as `diffq flower` runs it: Celery's `flower` command, with what Flower leaves
open closed first.

- `/metrics` and `/healthcheck` answer only with the basic-auth credentials, like every
  other page (Flower serves them to anyone: task names, worker names, counts).
- No page may be framed (`X-Frame-Options: DENY`, CSP `frame-ancestors 'none'`): its
  buttons revoke tasks and shut workers down, and a framing page could click them.

Run as `python -m cli.flower_guard -A tasks flower …` (the `celery` command's arguments).
"""

from __future__ import annotations

import sys

import tornado.web
from flower.views import BaseHandler, monitor

NOT_FRAMEABLE = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
}


def harden() -> None:
    flower_headers = BaseHandler.set_default_headers

    def set_default_headers(self) -> None:
        flower_headers(self)
        for name, value in NOT_FRAMEABLE.items():
            self.set_header(name, value)

    BaseHandler.set_default_headers = set_default_headers
    for handler in (monitor.Metrics, monitor.Healthcheck):
        if not getattr(handler.get, "__wrapped__", None):
            handler.get = tornado.web.authenticated(handler.get)


def main() -> None:
    harden()
    from celery.bin.celery import main as celery_main

    sys.argv = ["celery", *sys.argv[1:]]
    sys.exit(celery_main())


if __name__ == "__main__":
    main()
