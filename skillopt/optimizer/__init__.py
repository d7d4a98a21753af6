"""The optimizer algorithm: what the optimizer model reads (trajectories within a token budget) and how its
replies become a new skill — reflect, merge, select (clip to the edit budget), the update modes and rewrite,
the edit-budget schedule and the autonomous budget, the step buffer, the slow update, the meta skill, the deep
probe, the execution-notes appendix, and error rows kept apart from failures.

Each stage builds its messages and parses its replies here, as plain functions; the step that decides a
gate, a ranking or an update is ``flows/train.py``.

May import: ``skillopt.benchmarks``, ``skillopt.llm``, ``skillopt.sandbox``, ``skillopt.skill``,
``skillopt.core``.
"""
