"""Model-runner services: each takes token-id sequences (never text) and batches them itself.

``runners.batching`` is the one batching core every runner shares; ``runners.onnx`` and
``runners.tf`` wrap an engine around it and expose it as a BentoML service.
"""
