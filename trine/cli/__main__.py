"""``python -m trine.cli``: what launchers start child processes with."""

from trine.cli.main import main

main()
