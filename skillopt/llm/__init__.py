"""Model access: backends, structured output parsing, usage accounting."""
