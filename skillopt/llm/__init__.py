"""Model access: backends, structured output parsing, usage accounting (see BACKENDS.md)."""
