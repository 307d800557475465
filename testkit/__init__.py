"""Test infrastructure shared by the tests and the load tools: servers started and stopped by PID
(processes.py), the model of HAProxy's hash ring the routing tests check the proxy against
(haproxy_ring.py)."""
