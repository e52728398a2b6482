"""The admin and observability side: figures about queues, partitions, consumer groups and
messages (read through :mod:`queen.storage.admin`), this process's counters and history, and
the dashboard's charts, answered as typed values (:mod:`queen.admin.results`) that HTTP
renders (:mod:`queen.http.render_admin`, the dashboard's pages in :mod:`queen.http.dashboard`)."""
