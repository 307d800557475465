"""Real servers: `bentoml serve` on a free 127.0.0.1 port, awaited by readiness, stopped by PID
(the session's graph is tests/conftest.py's)."""
