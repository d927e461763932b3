"""The processes PEARL starts for independent runs: the local pool (``pool``) and the
environment they start with (``env``: huge pages, the compiled engine's switch)."""
