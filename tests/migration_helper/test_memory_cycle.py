"""The GPU memory cycle: min/max and the mini-batch time from its minima."""

from __future__ import annotations

from migration_helper.cycle import MemoryCycle

MB = 1 << 20


def sawtooth(cycle: MemoryCycle, period_s: float, dt: float, n: int, low: int, high: int) -> None:
    for i in range(n):
        phase = (i * dt) % period_s / period_s
        # Memory grows through the mini-batch (activations) and drops at its end.
        cycle.add(i * dt, int(low + (high - low) * phase))


def test_minibatch_time_is_the_interval_between_minima() -> None:
    cycle = MemoryCycle(window_s=60)
    sawtooth(cycle, period_s=0.25, dt=0.01, n=500, low=800 * MB, high=2000 * MB)
    s = cycle.summary()
    assert s.min_bytes == 800 * MB and 1900 * MB < s.max_bytes <= 2000 * MB
    assert abs(s.minibatch_s - 0.25) < 0.02 and s.minima >= 15


def test_flat_memory_has_no_cycle() -> None:
    cycle = MemoryCycle()
    for i in range(100):
        cycle.add(i * 0.01, 1000 * MB + (i % 3) * 4096)  # allocator jitter, not mini-batches
    s = cycle.summary()
    assert s.minibatch_s == 0.0 and s.min_bytes == 1000 * MB


def test_window_forgets_old_samples() -> None:
    cycle = MemoryCycle(window_s=1.0)
    cycle.add(0.0, 5000 * MB)
    for i in range(1, 30):
        cycle.add(1.0 + i * 0.1, 100 * MB)
    assert cycle.summary().max_bytes == 100 * MB
