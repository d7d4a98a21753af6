"""The shell: the ``skillopt`` command, the local Prefect server it keeps running, the preloaded runner, the
live terminal display and Ctrl-C handling. Together with the top-level ``flows``, ``tasks`` and
``deployments`` packages (installed as ``skillopt.flows`` etc.), this is the only place that imports Prefect.

May import: everything.
"""
