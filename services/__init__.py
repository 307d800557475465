"""Public services. ``services.tokenizer`` is the entry point users call (port 3000)."""
