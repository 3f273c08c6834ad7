"""Shared code of p40fleet: the validated stack spec, the GPU catalog, reports."""
