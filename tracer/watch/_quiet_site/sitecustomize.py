"""Found first on ranktrace's own helper processes' path (the GPU sampler): stands in for the user's
sitecustomize, which must not run inside ranktrace's helpers (it may print, hang, or import the job's world)."""
