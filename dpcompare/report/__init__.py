"""Comparison reports: results.json, plots, HTML, terminal tables."""
