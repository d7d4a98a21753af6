"""The benchmarks: the plug-in contract (``base.Benchmark``), the registry of installed plug-ins, the shared
rollout runner and its time limit per item, answer reading and grading, and one sub-package per built-in
benchmark.

May import: ``skillopt.llm``, ``skillopt.sandbox``, ``skillopt.skill``, ``skillopt.core``.
"""
