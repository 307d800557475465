"""The multi-tenant runner: thousands of small per-customer intent classifiers from a memory budget.

``store`` keeps versions on disk and publishes them atomically; ``classifier`` trains and exports
a tenant model; ``cache`` holds loaded models under a byte budget (LRU, one load per model);
``registry`` is what the HTTP API and the command line share; ``service`` is the BentoML service.
"""
