"""How values, types and tables are written for people: numbers with the digits that tell them
apart (display), widths that follow the terminal (terminal), a pydantic annotation as a reader
writes it (typetext). Imports engine.core only; every stage above may use it.
"""
