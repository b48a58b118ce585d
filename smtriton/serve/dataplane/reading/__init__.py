"""Reading a body into an inference."""
