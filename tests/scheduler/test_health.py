"""The scheduler's own health (scheduler/health.py) as /metrics exports it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from scheduler.health import DatabaseHealth
from scheduler.observe.metrics import _HealthCollector


def _scrape(health: DatabaseHealth) -> str:
    registry = CollectorRegistry()
    registry.register(_HealthCollector(health))
    return generate_latest(registry).decode()


def test_a_scheduler_whose_first_round_never_completes_shows_its_age() -> None:
    """A first round stuck (behind another process's SQLite write lock, say) was NaN, so an
    alert on gandiva_last_round_age_seconds never fired for a scheduler stuck from its start."""
    now = [1000.0]
    health = DatabaseHealth(lambda: now[0])
    now[0] += 90
    assert "gandiva_last_round_age_seconds 90.0" in _scrape(health)
    health.round_ended("ok")
    now[0] += 2
    text = _scrape(health)
    assert "gandiva_last_round_age_seconds 2.0" in text and 'gandiva_scheduling_rounds_total{outcome="ok"} 1.0' in text
    health.unreachable("ConnectionRefusedError: [Errno 111] Connection refused")
    now[0] += 5
    assert "gandiva_database_up 0.0" in _scrape(health) and "gandiva_database_down_seconds 5.0" in _scrape(health)
    assert health.text() == ("the scheduler is up; its database is unreachable since 00:18:12 UTC "
                             "(ConnectionRefusedError: [Errno 111] Connection refused)")
