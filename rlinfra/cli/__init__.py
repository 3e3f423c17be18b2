"""The ``rlinfra`` command line: thin typer commands over the library's layers."""
