"""linrec's command-line tools, each a module with ``main(argv)`` run as ``python -m linrec <tool>``."""
