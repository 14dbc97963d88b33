"""``trine annotate``: (being written)"""

import typer

annotate_app = typer.Typer(no_args_is_help=True, help="Post annotation items from a run's buffer.")
