"""Encoders: the contract and registry (``base``), the recurrent core and one module per family."""
