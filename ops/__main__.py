"""`python -m xraft.ops ...` is `xraftctl ...` (works without the console script on PATH)."""
from .cli import main

main(prog_name="xraftctl")
