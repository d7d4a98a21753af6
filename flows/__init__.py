"""Prefect flows: ``skill-train`` (with its epoch subflow) and ``skill-eval``."""
