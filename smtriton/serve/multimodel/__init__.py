"""The multi-model table, in the main process: loads, unloads, the archives and their staging in Triton."""
