"""Test and demo helpers shipped with the package: scenario captures derived from real ones."""
