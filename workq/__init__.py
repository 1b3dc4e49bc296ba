"""workq: the durable work queue built on the shared journal layer."""
