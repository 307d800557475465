"""Engines: a loaded model called with padded feeds (``serving.features.pad``), returning one row per
sequence. Each checks the model against its contract (``serving.contracts``) when it loads."""
