"""The admin and observability side: figures about queues, partitions, consumer groups and
messages (read through :mod:`queen.storage.admin`), this process's counters and history, and
the dashboard's pages (:mod:`queen.admin.dashboard`)."""
