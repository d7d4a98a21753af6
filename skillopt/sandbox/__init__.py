"""Running model-written code and agent CLIs confined by the operating system: bubblewrap namespaces,
a read-only system, a private workspace, resource limits, and child processes in their own group.

May import: ``skillopt.skill``, ``skillopt.core``.
"""
