"""The host-side watch over a running job: progress, samples, bursts, the verdict on silence."""
