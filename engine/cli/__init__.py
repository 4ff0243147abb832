"""The command line: the argument parser and each command (main), engine doctor (doctor),
engine schema (schema_doc) and the exit codes and their mapping from errors (exits). The top
layer: imports every stage.
"""
