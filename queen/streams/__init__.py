"""The server side of the official Streams SDK: query registration, atomic cycles (state
changes, sink pushes and the source ack in one transaction) and state reads.

``requests`` validates the bodies (pure), ``service`` applies them through
``queen/storage/streams.py``."""
