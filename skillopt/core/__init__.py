"""The foundation every room shares: configuration, errors, items and splits, records (item results,
patches, step records, summaries), scores and the gate's statistics, atomic files, redaction of secrets,
the shipped prompts and configs, and the live progress events.

May import: ``skillopt.skill`` (the records name its edits) and nothing else of skillopt; never Prefect.
"""
