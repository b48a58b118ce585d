"""Python-backend model sources; the repository builder copies each one to ``<model>/1/model.py``."""
