"""What the host gives this process: its cgroups (memory, CPU), its GPUs and their driver.

Shared by the main process and the workers; nothing here knows of HTTP, Triton or models."""
