"""Observing a running cluster: Prometheus metrics, the live dashboard, the decision log.

Shared by the scheduler and the helpers (both serve ``--http-listen``): ``http`` is the
small HTTP server both use; ``metrics`` the scheduler's metrics and hooks; ``dashboard``
the JSON the dashboard page (``static/index.html``) and ``gandiva top`` read.
"""
