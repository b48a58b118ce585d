"""`smtriton tune`: serve a model with candidate configurations and keep the fastest under a latency budget."""
