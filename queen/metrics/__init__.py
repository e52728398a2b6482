"""The broker's figures and ``/metrics``, by job:

- :mod:`queen.metrics.counters`: what the broker counts (:class:`Metrics`, plain integers
  the one Trio thread raises) and the name, help and kind of every family (:data:`FAMILIES`);
- :mod:`queen.metrics.exposition`: reading them for one process (:class:`LocalFigures`) or
  every worker of ``--workers N`` (:class:`SharedFigures`, over ``prometheus_client``'s
  multiprocess files) and writing Prometheus' text with ``prometheus_client``;
- :mod:`queen.metrics.original`: the original broker's names for the figures we have.
"""

from queen.metrics.counters import FAMILIES, Family, Metrics
from queen.metrics.exposition import (
    METRICS_DIR_ENV,
    PUBLISH_INTERVAL_S,
    Figures,
    LocalFigures,
    Reading,
    SharedFigures,
    create_shared_dir,
    forget_process,
    labelled_gauge_families,
    process_usage,
    remove_shared_dir,
    render_labelled_gauges,
)
from queen.metrics.original import ORIGINAL_NAMES, with_original_names

__all__ = [
    "FAMILIES",
    "METRICS_DIR_ENV",
    "ORIGINAL_NAMES",
    "PUBLISH_INTERVAL_S",
    "Family",
    "Figures",
    "LocalFigures",
    "Metrics",
    "Reading",
    "SharedFigures",
    "create_shared_dir",
    "forget_process",
    "labelled_gauge_families",
    "process_usage",
    "remove_shared_dir",
    "render_labelled_gauges",
    "with_original_names",
]
