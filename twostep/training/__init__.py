"""Training and evaluation: the seeds' recipe on a bundled task, scored with the runtime's decoding (above the
runtime, so that the model layer imports none of it)."""
