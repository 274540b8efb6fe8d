"""The API process's root: app/services.py's, plus what only the API holds (the
LISTEN/NOTIFY watcher of its event streams). Built by app/web/factory.py and kept on the
Flask app; views reach it through app/web/services.py."""

from __future__ import annotations

from app import services as root
from app.web.streams import StreamSlots
from app.web.throttle import FailureCounter, SharedFailures
from app.web.watch import JobWatcher


class ApiRoot(root.Services):
    @root.resource
    def watcher(self) -> JobWatcher:
        return JobWatcher(self.db, poll_progress=self.settings.progress_notify == "poll")

    @root.resource
    def auth_failures(self) -> FailureCounter:
        return FailureCounter(self.settings.auth_failures, shared=SharedFailures(self.db))

    @root.resource
    def streams(self) -> StreamSlots:
        return StreamSlots(self.settings.max_streams, self.settings.max_tenant_streams)

    def close(self) -> None:
        if self.opened("watcher"):
            self.watcher.close()
        super().close()
