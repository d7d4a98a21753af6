"""The run: a training or evaluation run assembled from its config (``Run``, ``RunSpec``), its rollouts and
their cache keys, the prefetch layer that fills the reply store ahead of the tasks, the run directory and
its records, the promotion registry, the cost estimate, the preflight checks, the HTML report, the artifacts'
content and the live progress events.

May import: ``skillopt.optimizer``, ``skillopt.benchmarks``, ``skillopt.llm``, ``skillopt.sandbox``,
``skillopt.skill``, ``skillopt.core`` — never Prefect, ``flows``, ``tasks`` or the shell.
"""
