"""Between `serve`'s main process and its front workers: the typed messages and the channel they cross."""
