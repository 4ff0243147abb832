"""Olive workflows read and translated into Kiln's (engine import-olive): the options, inputs,
data, metrics, passes, steps, systems and chains of an Olive config (one module each), the
importer that puts them together, what has no counterpart (missing) and the command (cli).
Imports report (for the command's output), the registry and below.
"""
