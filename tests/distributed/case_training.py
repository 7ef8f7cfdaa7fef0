"""Training equal to single-process training: filled in below."""
