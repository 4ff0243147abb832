"""The content-addressed store: objects, records and slots (store, records), locks that hold
across processes (locks) and verification of what is served (verify). Imports engine.core only.
"""
