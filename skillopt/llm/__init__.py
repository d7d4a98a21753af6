"""Model access: the backends (OpenAI, Azure OpenAI, Anthropic, OpenAI-compatible servers, the Codex and
Claude Code CLIs, local llama.cpp, the deterministic ``scripted`` backend), structured output and its parsing,
context windows, retries, rate limits, the reply store, usage and cost accounting.

May import: ``skillopt.sandbox``, ``skillopt.skill``, ``skillopt.core``.
"""
