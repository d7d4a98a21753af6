"""Prefect tasks: thin wrappers that give each pure skillopt function a cache policy, retries and tags."""
