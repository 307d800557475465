"""A concurrency ramp: 16 users, then 16 more every step, up to 160.

Kept apart from locustfile.py because Locust applies any shape class a locustfile defines to every
run. Use both:  locust -f loadtests/locustfile.py,loadtests/ramp.py ChatUser --headless ...
Step length: RAMP_STEP_S (default 10 s).
"""

from __future__ import annotations

import os

from locust import LoadTestShape


class Ramp(LoadTestShape):
    start_users = 16
    step_users = 16
    max_users = 160
    step_s = float(os.environ.get("RAMP_STEP_S", "10"))

    def tick(self) -> tuple[int, float] | None:
        step = int(self.get_run_time() // self.step_s)
        users = self.start_users + step * self.step_users
        return None if users > self.max_users else (users, float(self.step_users))
