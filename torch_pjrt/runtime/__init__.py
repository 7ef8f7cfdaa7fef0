"""Layers 1-3 of DESIGN.md: the device itself.

The C++ runtime (csrc/, built by build.py: allocator, guard, hooks, generators, streams,
profiler stubs, the eager fast path), the PJRT platform and its devices (platform.py, multiprocess.py),
storages holding JAX buffers (storage.py), and the device-side index checks raised at
host syncs (index_checks.py). Nothing here knows an op.
"""
