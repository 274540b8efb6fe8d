"""Operators' pieces that need no server: log lines, Flower's guard, DLQ selections."""

from __future__ import annotations

import json
import logging
import uuid

import pytest

from app.jobs.deadletters import DeadLetter, Selection
from app.logs import JobContextFilter, JsonFormatter, job_context
from cli import main


def _record(message: str, args=None) -> logging.LogRecord:
    record = logging.LogRecord("workers.execute", logging.INFO, __file__, 1, message, args, None)
    JobContextFilter().filter(record)
    return record


def test_json_lines_carry_the_job_inside_its_context_only():
    with job_context(job_id="j-1", tenant="t-1", attempt=2):
        inside = json.loads(JsonFormatter().format(_record("step %d", (3,))))
    outside = json.loads(JsonFormatter().format(_record("idle")))
    assert inside["message"] == "step 3"
    assert (inside["job_id"], inside["tenant"], inside["attempt"]) == ("j-1", "t-1", "2")
    assert "job_id" not in outside and outside["level"] == "INFO"


def test_celery_task_lines_are_tagged_with_the_job_id_without_their_arguments():
    task_id = str(uuid.uuid4())
    args = {"id": task_id, "name": "diffq.generate", "args": "{'prompt': 'secret'}"}
    line = json.loads(JsonFormatter().format(_record("Task %(name)s[%(id)s] received", args)))
    assert line["job_id"] == task_id
    assert "secret" not in json.dumps(line)


def test_flower_is_not_served_without_credentials(monkeypatch, capsys):
    monkeypatch.setenv("DIFFQ_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
    monkeypatch.delenv("DIFFQ_FLOWER_AUTH", raising=False)
    assert main(["flower"]) == 2
    assert "DIFFQ_FLOWER_AUTH" in capsys.readouterr().err


def test_the_management_api_is_found_beside_the_broker(tmp_path):
    from app.broker.backend import broker_for
    from app.config import load_settings

    home = {"DIFFQ_HOME": str(tmp_path)}
    settings = load_settings(
        {**home, "DIFFQ_BROKER_URL": "amqp://ops:p%40ss@rabbit.internal:5672/x"}
    )
    assert broker_for(settings).management_url() == "http://ops:p%40ss@rabbit.internal:15672/api/"
    named = load_settings(
        {**home, "DIFFQ_BROKER_URL": "amqp://h//", "DIFFQ_RABBITMQ_API_URL": "http://m:1/api/"}
    )
    assert broker_for(named).management_url() == "http://m:1/api/"
    assert broker_for(load_settings(home)).management_url() is None  # the embedded broker


def test_a_dead_letter_selection_must_name_what_it_takes():
    with pytest.raises(ValueError, match="select dead letters"):
        Selection()
    job = uuid.uuid4()
    letter = DeadLetter("gpu.tiny", message=None, job_id=job, error="gpu_oom: out of memory")
    assert Selection(job_ids=frozenset({job})).matches(letter)
    assert Selection(error_code="gpu_oom").matches(letter)
    assert not Selection(error_code="timeout").matches(letter)
    assert Selection(everything=True).matches(letter)
