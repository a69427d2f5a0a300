"""Compiled core of colibri: Cython extension modules over the C library in this folder."""
