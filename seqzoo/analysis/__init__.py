"""Analyses of trained runs: hidden states (QRNN paper Figure 3) and zones (MZU paper Figure 3)."""
