"""Prefect deployments: ``serve.py`` for local serving and ``prefect.yaml`` for work pools."""
