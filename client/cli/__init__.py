"""`rknn-client`, the command line: its commands (commands.py) and its argument parser (parser.py).

The features' own commands (farm, toolkit, boards, load) live in their folders and are added here."""

from rknn_client.cli.commands import main

__all__ = ["main"]
