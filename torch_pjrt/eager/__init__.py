"""Layer 4a of DESIGN.md: eager kernels on PrivateUse1, generated from the op table.

kernels.py binds dispatcher calls to lowerings and runs their cached executables;
errors.py gives torch's exceptions; transfer.py and view_kernels.py are the kernels
that are not lowerings (copies between devices, views); fallback.py runs ops the table
lacks (a decomposition, else the loud CPU fallback).
"""
