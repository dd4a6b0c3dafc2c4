"""What runs inside every rank of the job: stdlib only, plus the ring format and redaction."""
