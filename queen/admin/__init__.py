"""The admin and observability side, one module per subject: queues, messages, consumer
groups, the process and the broker (``system``), the database, the scrape's gauges and the
operator's actions. Each holds its typed queries (parsed once from a request), its typed
answers and its reads through :mod:`queen.storage.admin`; :mod:`queen.admin.service` puts
them together. HTTP renders the answers (:mod:`queen.http.render_admin`, the dashboard's
pages in :mod:`queen.http.dashboard`)."""
