"""Imported last by the workers' fork server, after the worker's own modules: every object alive then is
frozen out of the garbage collector's passes, so the workers forked from it keep sharing those pages
(a full collection writes to each object it visits, which copies the page the object is on: about
15 MiB more private memory a worker, measured)."""

from smtriton.serve.eventloop import freeze_heap

freeze_heap()
