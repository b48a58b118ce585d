"""Bodies of several records."""
