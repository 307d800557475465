"""Load runs (Locust) and the side-by-side benchmark, plus the server helper both use."""
