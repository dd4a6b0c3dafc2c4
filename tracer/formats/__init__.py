"""What is on disk, stated once and imported by both wings: the ring layout and its reader, redaction, op
names, the events/observations/stacks table schemas. ringformat and redact are stdlib-only (they run inside the
job's ranks); nothing here imports the rest of tracer/ or analyzers/."""
