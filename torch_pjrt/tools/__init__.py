"""Command-line tools of torch-pjrt: the CUDA lock-in audit and the environment doctor.

Nothing here imports torch or jax at module level; the commands import them when they run.
"""
