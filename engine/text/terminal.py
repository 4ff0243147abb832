"""The console the CLI's tables and lines are printed on: rich, as wide as the output is."""

from __future__ import annotations

from rich.console import Console, ConsoleDimensions

from engine.text.display import output_width


class FittedConsole(Console):
    """A rich Console whose width is ``output_width`` of the stream it writes to, asked at each
    print: COLUMNS when set, else the terminal's, else 100 (rich itself prefers any terminal
    among stdin/stdout/stderr to COLUMNS, and keeps a width given once for good)."""

    @property
    def size(self) -> ConsoleDimensions:
        return ConsoleDimensions(output_width(self.file), super().size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


def make_console(stderr: bool = False) -> Console:
    return FittedConsole(highlight=False, stderr=stderr)
